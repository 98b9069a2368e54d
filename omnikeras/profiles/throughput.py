"""Training throughput of one model on this process's device, batch size by batch size.

Run as `python -m omnikeras.profiles.throughput` it is the child process that
`measure_isolated` starts: TensorFlow's thread settings are fixed when its runtime
starts, so every setting is measured in a fresh process.
"""

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    # Imported by the caller: importing it here would start TensorFlow before the
    # thread settings are fixed.
    import keras

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def measure_throughput(
    model: "keras.Model",
    batch_sizes: Sequence[int],
    repeats: int = 5,
    seconds: float = 1.0,
    report: Callable[[str], None] | None = None,
) -> list[float]:
    """The median examples/s of training `model` at each batch size.

    Each batch size gets two untimed steps (the first traces the train function), then
    `repeats` timed runs of as many steps as fill about `seconds` each; the median of the
    runs resists a machine whose load comes and goes. The data are random, of the model's
    input and output shapes, and the model is compiled, if it was not, with SGD and a
    mean squared error, without XLA, as `GroupedAsyncStrategy` trains it.

    Args:
        model: A built Keras model with one input.
        batch_sizes: The batch sizes to measure.
        repeats: Timed runs per batch size. Defaults to 5.
        seconds: About how long each timed run lasts. Defaults to 1.
        report: Called with one line per timed run, to show progress.

    Example:

    >>> measure_throughput(reference_cnn(), [16, 64], repeats=3, seconds=0.2)
    [910.3, 1480.7]
    """
    import keras
    import tensorflow as tf

    if not model.compiled:
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=False)
    rng = np.random.default_rng(0)
    medians = []
    for batch_size in batch_sizes:
        x = tf.constant(rng.random((batch_size, *model.input_shape[1:]), dtype=np.float32))
        y = tf.constant(rng.random((batch_size, *model.output_shape[1:]), dtype=np.float32))
        for _ in range(2):
            model.train_on_batch(x, y)
        start = time.perf_counter()
        model.train_on_batch(x, y)
        steps = max(1, round(seconds / max(time.perf_counter() - start, 1e-6)))
        rates = []
        for repeat in range(repeats):
            start = time.perf_counter()
            for _ in range(steps):
                # Returns Python floats: the step has finished when it returns.
                model.train_on_batch(x, y)
            rates.append(steps * batch_size / (time.perf_counter() - start))
            if report:
                report(f"batch {batch_size}, run {repeat + 1}/{repeats}: {rates[-1]:.0f} examples/s")
        medians.append(statistics.median(rates))
    return medians


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Prints one JSON line: the model's throughputs.")
    parser.add_argument("--model", required=True, help="MODULE:FUNCTION building the model")
    parser.add_argument("--batch-sizes", required=True, type=lambda s: [int(b) for b in s.split(",")])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--label", default="", help="prefix of the progress lines")
    args = parser.parse_args(argv)

    from omnikeras.profiles.model_spec import load_builder

    model = load_builder(args.model)()

    def report(line: str) -> None:
        print(f"{args.label}{line}", file=sys.stderr, flush=True)

    rates = measure_throughput(model, args.batch_sizes, args.repeats, args.seconds, report)
    print(json.dumps({
        "examples_per_second": rates,
        "parameters": [[list(v.shape), str(v.dtype)] for v in model.trainable_variables],
    }), flush=True)


if __name__ == "__main__":
    main()
