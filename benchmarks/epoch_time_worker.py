"""Runs the main job's script (`examples/fashion_mnist.py`) as it is and times its epochs,
for `strategy_overhead.py`: launched, or with `--plain` as plain Keras.

    epoch_time_worker.py [--plain] examples/fashion_mnist.py --fixed --epochs 3

The script runs unchanged, with its metrics, validation and progress line. This wrapper
adds one callback to its `fit`, which times each epoch from its start to the end of its
validation, and within it the first batch and the validation, and prints `RESULT
{"epoch_s": [..], "first_batch_s": [..], "validation_s": [..], "steps": [..]}` from the
chief. With
`--plain`, `omnikeras.GroupedAsyncStrategy` is replaced by Keras' default strategy, so the
same script trains in this one process as it would without omnikeras. Started by
`turns.run_in_turns`, each epoch is a turn, the first its warm-up.
"""

import json
import runpy
import sys
import time
import types
from typing import Any

import keras
import tensorflow as tf
from turns import Turn

import omnikeras
from omnikeras import tf_config
from omnikeras.strategy import GroupedAsyncStrategy


class EpochClock(keras.callbacks.Callback):
    def __init__(self, turn: Turn | None) -> None:
        super().__init__()
        self._turn = turn
        self.epoch_s: list[float] = []
        self.first_batch_s: list[float] = []
        self.validation_s: list[float] = []
        self.steps: list[int] = []
        self._began = 0.0
        self._validation_began = 0.0
        self._batches = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._began, self._batches = time.perf_counter(), 0

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._batches == 0:
            self.first_batch_s.append(time.perf_counter() - self._began)
        self._batches += 1

    def on_test_begin(self, logs: dict | None = None) -> None:
        self._validation_began = time.perf_counter()

    def on_test_end(self, logs: dict | None = None) -> None:
        self.validation_s.append(time.perf_counter() - self._validation_began)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        # Keras calls this after the epoch's validation.
        self.epoch_s.append(time.perf_counter() - self._began)
        self.steps.append(self._batches)
        if self._turn is not None:
            self._turn.end()


class PlainKeras:
    """What the script sees of the strategy, as plain Keras: the default strategy's scope,
    and this process as the chief."""

    config = types.SimpleNamespace(is_chief=True)

    def scope(self) -> Any:
        return tf.distribute.get_strategy().scope()


def main() -> None:
    plain = sys.argv[1] == "--plain"
    script, *script_args = sys.argv[2:] if plain else sys.argv[1:]
    if plain:
        omnikeras.GroupedAsyncStrategy = PlainKeras
        chief = True
    else:
        omnikeras.GroupedAsyncStrategy = GroupedAsyncStrategy
        config = tf_config.worker_config_from_env()
        chief = config is not None and config.is_chief
    clock = EpochClock(Turn.from_environment() if chief else None)
    fit = keras.Model.fit

    def timed_fit(model: keras.Model, *args: Any, callbacks: list | None = None, **kwargs: Any) -> Any:
        return fit(model, *args, callbacks=[*(callbacks or []), clock], **kwargs)

    keras.Model.fit = timed_fit
    sys.argv = [script, *script_args]
    runpy.run_path(script, run_name="__main__")
    if chief:
        times = {
            "epoch_s": clock.epoch_s,
            "first_batch_s": clock.first_batch_s,
            "validation_s": clock.validation_s,
            "steps": clock.steps,
        }
        print("RESULT " + json.dumps(times), flush=True)


if __name__ == "__main__":
    main()
