"""The training script of the tuner's end-to-end tests: digits under OmnivoreCallback."""

import argparse
import os

import keras

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--storage", required=True)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--budget", type=int, default=8)
parser.add_argument(
    "--diverging", action="store_true",
    help="a linear head under squared error on inputs scaled up: the larger learning rates blow up to NaN",
)
parser.add_argument("--csv")
args = parser.parse_args()

keras.utils.set_random_seed(0)
(x_train, y_train), (x_test, y_test) = omnikeras.datasets.digits()
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10, activation=None if args.diverging else "softmax"),
    ])
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss="mse" if args.diverging else "sparse_categorical_crossentropy",
    )
if args.diverging:
    x_train, x_test = x_train * 30, x_test * 30
    y_train, y_test = keras.utils.to_categorical(y_train, 10), keras.utils.to_categorical(y_test, 10)
callbacks: list[keras.callbacks.Callback] = [
    omnikeras.OmnivoreCallback(target_loss=0.05 if args.diverging else 0.2, storage=args.storage, budget=args.budget)
]
if args.csv:
    callbacks.append(keras.callbacks.CSVLogger(args.csv))
model.fit(x_train, y_train, batch_size=32, epochs=args.epochs, callbacks=callbacks, verbose=2)
print("final loss", model.evaluate(x_test, y_test, verbose=0), flush=True)
os._exit(0)
