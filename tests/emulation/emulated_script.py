"""The training script of the emulated-cluster tests: digits, synchronous by default,
tuned with `--tune`.

Prints one line `RESULT {json}` on the chief.
"""

import argparse
import json

import keras

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--tune", metavar="STORAGE", help="train under OmnivoreCallback, its study in STORAGE")
args = parser.parse_args()

keras.utils.set_random_seed(0)
(x_train, y_train), (x_test, y_test) = omnikeras.datasets.digits()
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.5), "sparse_categorical_crossentropy", metrics=["accuracy"])
callbacks = [omnikeras.OmnivoreCallback(target_loss=0.1, storage=args.tune, tuning_overhead=0.5)] if args.tune else []
model.fit(x_train, y_train, batch_size=32, epochs=args.epochs, callbacks=callbacks, verbose=2 if strategy.config.is_chief else 0)
if strategy.config.is_chief:
    result = {
        "test_accuracy": float(model.evaluate(x_test, y_test, verbose=0)[1]),
        "shared_memory": strategy.worker.client.shared_memory_shards,
        "num_workers": strategy.config.num_workers,
        "throughputs": list(strategy.config.throughputs or []),
    }
    print("RESULT " + json.dumps(result), flush=True)
