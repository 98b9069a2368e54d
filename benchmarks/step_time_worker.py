"""The training script that `strategy_overhead.py` runs, launched or as plain Keras.

Trains one model on Fashion-MNIST with SGD(0.01, momentum 0.9), or Keras' default Adam
(`--optimizer adam`), and batch 64 for a fixed
number of steps and prints `RESULT {"mean_step_s": .., "median_step_s": .., "steps": ..}`,
timed over the steps after the first `--warmup` (tracing, first allocations).

Started by `turns.run_in_turns`, the steps after the warm-up run in turns of
`--turn-steps`; the first step of each turn, which starts from idle threads, is not timed.
"""

import argparse
import contextlib
import json
import pathlib
import statistics
import sys
import time

import keras

import omnikeras
from omnikeras.profiles.reference_cnn import reference_cnn

# The main job's CNN, so that the benchmark times the model `make run` trains.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import fashion_mnist as fashion_mnist_example
from turns import Turn

BATCH = 64


def deep_mlp() -> keras.Model:
    """64 small dense layers: 128 variables of about 309K parameters in all, where the
    server's cost by variable shows (the CNNs have 8 and 10)."""
    hidden = [keras.layers.Dense(64, activation="relu") for _ in range(63)]
    return keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), *hidden, keras.layers.Dense(10, activation="softmax")]
    )


MODELS = {"main": fashion_mnist_example.build_model, "reference": reference_cnn, "deep": deep_mlp}

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=sorted(MODELS), required=True)
parser.add_argument("--plain", action="store_true", help="plain Keras in this process, no strategy")
parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--warmup", type=int, default=30)
parser.add_argument("--turn-steps", type=int, default=40, help="steps a turn, where the run takes turns")
args = parser.parse_args()


class StepClock(keras.callbacks.Callback):
    """Times each step after the warm-up from the end of the one before; with `turns`, the
    steps run in turns (see the module's docstring)."""

    def __init__(self, turn: Turn | None) -> None:
        super().__init__()
        self.step_s: list[float] = []
        self.batches = 0
        self._turn = turn
        self._last_end: float | None = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        now = time.perf_counter()
        self.batches += 1
        if self.batches > args.warmup and self._last_end is not None:
            self.step_s.append(now - self._last_end)
        self._last_end = now
        if self._turn is not None and self.batches >= args.warmup and (self.batches - args.warmup) % args.turn_steps == 0:
            self._turn.end()
            self._last_end = None


keras.utils.set_random_seed(0)
(x_train, y_train), _ = omnikeras.datasets.fashion_mnist()
examples = BATCH * args.steps
x_train, y_train = x_train[:examples], y_train[:examples]
strategy = None if args.plain else omnikeras.GroupedAsyncStrategy()
with strategy.scope() if strategy else contextlib.nullcontext():
    model = MODELS[args.model]()
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9) if args.optimizer == "sgd" else keras.optimizers.Adam()
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
chief = strategy is None or strategy.config.is_chief
clock = StepClock(Turn.from_environment() if chief else None)
model.fit(x_train, y_train, batch_size=BATCH, epochs=1, callbacks=[clock], verbose=0)
if chief:
    result = {
        "mean_step_s": statistics.fmean(clock.step_s),
        "median_step_s": statistics.median(clock.step_s),
        "steps": clock.batches,
        "parameters": model.count_params(),
    }
    if strategy is not None:
        result["shared_memory"] = bool(strategy.worker.client.shared_memory_shards)
    print("RESULT " + json.dumps(result), flush=True)
