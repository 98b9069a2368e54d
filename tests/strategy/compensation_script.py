"""A functional model with two inputs and two outputs, compiled with the momentum one would
use for synchronous training: the compensation tests train it with one worker and with
several groups.

Prints one line `RESULT {json}` with the test accuracy, the last losses and the chief's
last epoch logs.
"""

import argparse
import json

import keras
import numpy as np

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--learning-rate", type=float, default=0.05)
parser.add_argument("--momentum", type=float, default=0.9)
args = parser.parse_args()

keras.utils.set_random_seed(0)
(x_train, y_train), (x_test, y_test) = omnikeras.datasets.digits()


def inputs_and_targets(images: np.ndarray, labels: np.ndarray) -> tuple[dict, dict]:
    # The second input is each image's ink, seen through noise; the second output, its ink.
    ink = images.mean(axis=(1, 2, 3))
    noisy = ink + np.random.default_rng(len(images)).normal(0, 0.05, ink.shape).astype(np.float32)
    return {"image": images, "ink_seen": noisy[:, None]}, {"digit": labels, "ink": ink[:, None]}




def build() -> keras.Model:
    image = keras.Input((8, 8, 1), name="image")
    ink_seen = keras.Input((1,), name="ink_seen")
    features = keras.layers.Flatten()(keras.layers.Conv2D(16, 3, activation="relu")(image))
    hidden = keras.layers.Dense(64, activation="relu")(keras.layers.Concatenate()([features, ink_seen]))
    outputs = {
        "digit": keras.layers.Dense(10, activation="softmax", name="digit")(hidden),
        "ink": keras.layers.Dense(1, name="ink")(hidden),
    }
    model = keras.Model({"image": image, "ink_seen": ink_seen}, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(args.learning_rate, momentum=args.momentum),
        loss={"digit": "sparse_categorical_crossentropy", "ink": "mse"},
        metrics={"digit": "accuracy"},
    )
    return model


strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = build()
x, y = inputs_and_targets(x_train, y_train)
history = model.fit(x, y, batch_size=32, epochs=args.epochs, verbose=2)
if strategy.config.is_chief:
    x, y = inputs_and_targets(x_test, y_test)
    evaluated = model.evaluate(x, y, verbose=0, return_dict=True)
    last = {key: values[-1] for key, values in history.history.items()}
    print("RESULT " + json.dumps({"test_accuracy": evaluated["digit_accuracy"], "ink_loss": evaluated["ink_loss"], "logs": last, "history": history.history}))
