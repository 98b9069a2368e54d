"""Trains a small model with two local replicas (two logical CPUs), through the strategy
run as `python` (a single worker with a parameter server of its own) or, with `--plain`,
through Keras' `MirroredStrategy` over the same two devices, and writes the weights and
the steps of each epoch."""

import argparse
import json
import pathlib

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402  (after the devices are configured)

import omnikeras  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--plain", action="store_true")
args = parser.parse_args()

DEVICES = ["/cpu:0", "/cpu:1"]
rng = np.random.default_rng(0)
x = rng.normal(size=(192, 8)).astype(np.float32)
y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)


class Steps(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.per_epoch: list[int] = []

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.per_epoch.append(0)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.per_epoch[-1] += 1


strategy = tf.distribute.MirroredStrategy(DEVICES) if args.plain else omnikeras.GroupedAsyncStrategy(devices=DEVICES)
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
steps = Steps()
model.fit(x, y, batch_size=32, epochs=3, shuffle=False, callbacks=[steps], verbose=0)
out = pathlib.Path(args.out)
np.savez(out / "weights.npz", *[keras.ops.convert_to_numpy(w) for w in model.trainable_variables])
(out / "result.json").write_text(
    json.dumps({"replicas": strategy.num_replicas_in_sync, "steps_per_epoch": steps.per_epoch})
)
