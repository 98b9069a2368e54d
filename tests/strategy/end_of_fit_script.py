"""Trains a small model through the strategy with validation and
`EarlyStopping(restore_best_weights=True)`, and writes what `fit` left on this worker:
its History, its weights and, on the chief, whether they are the best weights and the
server's.

`mode="max"` makes the best epoch the one with the highest validation loss, the first in
a run that learns: the weights Keras restores then differ from the last ones.
"""

import argparse
import json
import pathlib
import time

import keras
import numpy as np

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument(
    "--again",
    action="store_true",
    help="a second fit right after the first, whose end the chief holds up until the other "
    "worker has ended its first fit on its own",
)
args = parser.parse_args()


class HoldUp(keras.callbacks.Callback):
    def on_train_end(self, logs: dict | None = None) -> None:
        time.sleep(3)

(x, y), (x_val, y_val) = omnikeras.datasets.digits()
x, y = x[:512], y[:512]
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
stopping = keras.callbacks.EarlyStopping(mode="max", patience=100, restore_best_weights=True)
held = [HoldUp()] if args.again and strategy.config.is_chief else []
history = model.fit(x, y, batch_size=32, epochs=4, validation_data=(x_val, y_val), callbacks=[stopping, *held], verbose=0)
if args.again:
    history = model.fit(x, y, batch_size=32, epochs=2, validation_data=(x_val, y_val), callbacks=[stopping], verbose=0)
result: dict = {"epoch": history.epoch, "history": history.history}
index = strategy.config.worker_index
if strategy.config.is_chief:
    final = strategy.worker.client.pull().weights
    result["holds_best"] = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), stopping.best_weights))
    result["server_holds_them"] = all(np.array_equal(v.numpy(), final[v.path]) for v in model.weights)
    result["best_epoch"] = stopping.best_epoch
    result["evaluated_loss"] = model.evaluate(x_val, y_val, verbose=0)[0]
np.savez(pathlib.Path(args.out, f"weights-{index}.npz"), *model.get_weights())
pathlib.Path(args.out, f"worker-{index}.json").write_text(json.dumps(result))
