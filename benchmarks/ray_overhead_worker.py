"""The training script of `ray_overhead.py`: the digits model under the strategy; the
chief prints `RESULT {"updates_per_s": ..}`, the updates the whole cluster made per
second from the end of its first step to the end of `fit` (joining is not counted)."""

import argparse
import json
import time

import keras

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=20)
args = parser.parse_args()

keras.utils.set_random_seed(0)
(x_train, y_train), _ = omnikeras.datasets.digits()
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy")


def version() -> int:
    return strategy.worker.client.stats()[0].model_version


first: list[float] = []


def note_first_step(batch: int, logs: dict) -> None:
    if not first:
        first.extend([time.perf_counter(), version()])


model.fit(x_train, y_train, batch_size=64, epochs=args.epochs, verbose=0,
          callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=note_first_step)])
if strategy.config.is_chief:
    seconds = time.perf_counter() - first[0]
    print("RESULT " + json.dumps({"updates_per_s": (version() - first[1]) / seconds}), flush=True)
