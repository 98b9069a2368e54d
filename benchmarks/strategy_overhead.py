"""Step time of one worker training through a local parameter server, against plain Keras.

One figure, printed as the last line of stdout, one JSON object:

* `step_time_vs_plain_keras`: the median time of a training step of the reference CNN
  (`omnikeras.profiles.reference_cnn`: 1.2M parameters, 28x28x1 input; batch 64) under
  `GroupedAsyncStrategy` with one worker and a parameter server in a process of its own
  on this machine, over the median step time of plain Keras `fit` of the same model and
  batch in the same process. The two alternate, round after
  round, and the figure is the median of the rounds' ratios, so load that comes and goes
  on a shared machine weighs on both alike. The server's process competes with the worker
  for the cores, as it does in a real local cluster.

Progress goes to stderr. `--quick` runs two short rounds, for a correctness check.

    .venv/bin/python benchmarks/strategy_overhead.py [--quick]
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import omnikeras  # noqa: E402
from omnikeras.launcher.processes import start_parameter_server  # noqa: E402
from omnikeras.profiles.reference_cnn import reference_cnn  # noqa: E402

BATCH = 64


class StepTimer(keras.callbacks.Callback):
    """Times each step from the end of the one before, skipping the first (tracing)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self._last: float | None = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now


def build_model() -> keras.Model:
    model = reference_cnn()
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy")
    return model


def median_step(model: keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    timer = StepTimer()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    return statistics.median(timer.times)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two short rounds, for a correctness check")
    args = parser.parse_args()
    rounds, steps = (2, 6) if args.quick else (7, 30)

    rng = np.random.default_rng(0)
    x = rng.random((BATCH * steps, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, BATCH * steps)

    server, address = start_parameter_server([], log=open(os.devnull, "w"))
    try:
        plain = build_model()
        strategy = omnikeras.GroupedAsyncStrategy(omnikeras.WorkerConfig((address,)))
        with strategy.scope():
            through_server = build_model()
        log(f"model: {plain.count_params():,} parameters, batch {BATCH}, {steps} steps a round")
        ratios = []
        for round_index in range(rounds):
            plain_step = median_step(plain, x, y)
            server_step = median_step(through_server, x, y)
            ratios.append(server_step / plain_step)
            log(
                f"round {round_index + 1}/{rounds}: plain {plain_step * 1e3:.1f} ms/step, "
                f"through the server {server_step * 1e3:.1f} ms/step, ratio {ratios[-1]:.3f}"
            )
        version = strategy.worker.client.stats()[0].model_version
        assert version == rounds * steps, f"the server applied {version} updates, not {rounds * steps}"
    finally:
        server.terminate()
    print(json.dumps({"step_time_vs_plain_keras": round(statistics.median(ratios), 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
