"""Trains a small model through the strategy with a learning-rate schedule of the user's
own, which only TensorFlow can evaluate (linear in the step; with `--warmup`, a warm-up
from 0, as keras-io's), and saves what the chief saw as training ended: its optimizer's
iteration count, the servers' count, the rate they applied last and the epochs' losses.

Each step takes 30 ms at least, as a larger model's would: otherwise the whole training
takes less time than a worker's first step (its tracing), and one group trains alone."""

import argparse
import time

import keras
import numpy as np

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--warmup", action="store_true")
args = parser.parse_args()


class Linear(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 1e-4 * (keras.ops.cast(step, "float32") + 1)


class WarmUp(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.3 * keras.ops.minimum(keras.ops.cast(step, "float32") / 50, 1.0)


class Paced(keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        time.sleep(0.03)


(x, y), _ = omnikeras.datasets.digits()
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(WarmUp() if args.warmup else Linear()), loss="sparse_categorical_crossentropy")
history = model.fit(x, y, batch_size=32, epochs=3, verbose=0, callbacks=[Paced()])
if strategy.config.is_chief:
    stats = strategy.worker.client.stats()[0]
    np.savez(
        args.out,
        iterations=keras.ops.convert_to_numpy(model.optimizer.iterations),
        updates=stats.updates_applied,
        learning_rate=stats.learning_rate_in_force,
        losses=history.history["loss"],
    )
