"""Trains a small model through the strategy with a learning-rate schedule of the user's
own, which only TensorFlow can evaluate (linear in the step), and saves what the chief
saw as training ended: its optimizer's iteration count, the servers' count and the rate
they applied last."""

import argparse

import keras
import numpy as np

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()


class Linear(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 1e-4 * (keras.ops.cast(step, "float32") + 1)


(x, y), _ = omnikeras.datasets.digits()
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(Linear()), loss="sparse_categorical_crossentropy")
model.fit(x, y, batch_size=32, epochs=3, verbose=0)
if strategy.config.is_chief:
    stats = strategy.worker.client.stats()[0]
    np.savez(
        args.out,
        iterations=keras.ops.convert_to_numpy(model.optimizer.iterations),
        updates=stats.updates_applied,
        learning_rate=stats.learning_rate_in_force,
    )
