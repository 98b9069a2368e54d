"""The training script of the tuner's end-to-end tests: digits under OmnivoreCallback."""

import argparse
import json

import keras
import numpy as np

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--storage", required=True)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--budget", type=int, default=8)
parser.add_argument("--overhead", type=float, default=0.1, help="the tuning overhead")
parser.add_argument(
    "--diverging", action="store_true",
    help="a linear model under squared error on inputs scaled up: learning rates of 0.1 and more blow up",
)
parser.add_argument("--csv")
parser.add_argument("--report", action="store_true", help="print RESULT with the accuracy, steps and weights")
args = parser.parse_args()

keras.utils.set_random_seed(0)
(x_train, y_train), (x_test, y_test) = omnikeras.datasets.digits()
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    hidden = [] if args.diverging else [keras.layers.Dense(32, activation="relu")]
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Flatten(),
        *hidden,
        keras.layers.Dense(10, activation=None if args.diverging else "softmax"),
    ])
    model.compile(
        optimizer=keras.optimizers.SGD(0.001 if args.diverging else 0.01, momentum=0.9),
        loss="mse" if args.diverging else "sparse_categorical_crossentropy",
        metrics=[] if args.diverging else ["accuracy"],
    )
if args.diverging:
    x_train, x_test = x_train * 3, x_test * 3
    y_train, y_test = keras.utils.to_categorical(y_train, 10), keras.utils.to_categorical(y_test, 10)
callbacks: list[keras.callbacks.Callback] = [
    omnikeras.OmnivoreCallback(
        target_loss=0.05 if args.diverging else 0.2, storage=args.storage, budget=args.budget, tuning_overhead=args.overhead
    )
]
if args.csv:
    callbacks.append(keras.callbacks.CSVLogger(args.csv))
model.fit(x_train, y_train, batch_size=32, epochs=args.epochs, callbacks=callbacks, verbose=2)
if args.report:
    result = {
        "test_accuracy": float(model.evaluate(x_test, y_test, verbose=0)[1]),
        "steps": strategy.worker.step,
        "weights_checksum": float(sum(np.sum(w) for w in model.get_weights())),
    }
    print("RESULT " + json.dumps(result), flush=True)
