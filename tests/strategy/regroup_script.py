"""The training script of the regrouping stress test: while every worker trains, the
chief regroups the cluster and restores a snapshot every few steps, and evaluates the
model now and then, as the tuner and a user's callbacks do.

Prints one line `RESULT {json}` with what the test checks.
"""

import argparse
import json

import keras
import numpy as np

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--cycles", type=int, default=100)
parser.add_argument("--every", type=int, default=2, help="steps between two changes")
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


class Churn(keras.callbacks.Callback):
    """Cycles through 4, 2, 1 and 2 groups, restores the first snapshot every third
    change, and evaluates every fifth."""

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.steps = self.changes = 0
        self.groups_seen: set[int] = set()
        self.client = strategy.worker.client
        self.client.save_snapshot("start")

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.steps += 1
        self.groups_seen.add(strategy.worker.place.num_groups)
        if self.steps % args.every:
            return
        self.client.set_groups(num_groups=(4, 2, 1, 2)[self.changes % 4])
        if self.changes % 3 == 0:
            self.client.restore_snapshot("start")
        if self.changes % 5 == 0:
            self.model.evaluate(x_test[:200], y_test[:200], verbose=0)
        self.changes += 1
        if self.changes >= args.cycles:
            self.model.stop_training = True


churn = Churn()
model.fit(x_train, y_train, batch_size=32, epochs=1000, callbacks=[churn] if strategy.config.is_chief else [], verbose=0)
result = {
    "worker_index": strategy.config.worker_index,
    "steps": strategy.worker.step,
    "weights_checksum": float(sum(np.sum(w) for w in model.get_weights())),
}
if strategy.config.is_chief:
    result |= {"changes": churn.changes, "groups_seen": sorted(churn.groups_seen)}
print("RESULT " + json.dumps(result), flush=True)
