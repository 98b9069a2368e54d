"""The training script that `emulated_cluster.py` launches on every emulated host.

Trains the reference CNN on random 28x28x1 images, batch 64 per update. The chief lets
`--warmup` seconds pass after its first step, then measures for `--seconds`: the updates
the parameter server applied (from its push replies' versions) and the share of its own
steps spent in the exchange with the server (gradients out, group step, weights back);
then it ends training for everyone and prints `RESULT {json}`.
"""

import argparse
import json
import time

import keras
import numpy as np

import omnikeras
from omnikeras.profiles.reference_cnn import reference_cnn

parser = argparse.ArgumentParser()
parser.add_argument("--warmup", type=float, default=10.0)
parser.add_argument("--seconds", type=float, default=30.0)
args = parser.parse_args()

strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = reference_cnn()
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy")
rng = np.random.default_rng(0)
x = rng.random((64 * 64, 28, 28, 1), dtype=np.float32)
y = rng.integers(0, 10, 64 * 64)
worker = strategy.worker
exchange_seconds = 0.0
push_pull = worker.push_pull


def timed_push_pull(*arrays: np.ndarray, **options: bool) -> list[np.ndarray]:
    global exchange_seconds
    started = time.perf_counter()
    try:
        return push_pull(*arrays, **options)
    finally:
        exchange_seconds += time.perf_counter() - started


worker.push_pull = timed_push_pull


class Window(keras.callbacks.Callback):
    """Measures from `--warmup` seconds after the first step, for `--seconds`."""

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        now = time.perf_counter()
        if not hasattr(self, "first"):
            self.first = now
            return
        version = worker.last_push.model_version
        if not hasattr(self, "start") and now - self.first >= args.warmup:
            self.start, self.start_version, self.start_exchange, self.steps = now, version, exchange_seconds, 0
        elif hasattr(self, "start"):
            self.steps += 1
            if now - self.start >= args.seconds:
                self.result = {
                    "seconds_per_update": (now - self.start) / max(version - self.start_version, 1),
                    "updates": version - self.start_version,
                    "chief_steps": self.steps,
                    "exchange_share": (exchange_seconds - self.start_exchange) / (now - self.start),
                }
                self.model.stop_training = True


window = Window()
model.fit(x, y, batch_size=64, epochs=1000, callbacks=[window] if strategy.config.is_chief else [], verbose=0)
if strategy.config.is_chief:
    print("RESULT " + json.dumps(window.result), flush=True)
