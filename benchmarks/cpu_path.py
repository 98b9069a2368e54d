"""The batch-merging CPU path against co-located worker processes and plain Keras.

Three figures, printed as the last line of stdout, one JSON object:

* `merged_vs_4_processes`: examples/s of the merged path (ONE process training the whole
  batch of 256 per step, with the thread settings that `omnikeras.profiles` measures here
  first) over examples/s of 4 plain Keras worker processes training their quarter of the
  batch (64) each, at the same time, with TensorFlow's and Keras' defaults: what a naive
  deployment of 4 workers on this machine runs.
* `merged_vs_plain_keras`: the merged path over plain Keras `fit` in one process with
  TensorFlow's default threads and Keras' defaults (`jit_compile="auto"`, which leaves XLA
  off on a machine without a GPU and turns it on where there is one), same batch of 256.
* `flops_fraction_of_matmul`: the merged path's training FLOP/s over the FLOP/s of a
  2048x2048 float32 matmul with TensorFlow's default threads, measured in the same rounds.
  Training FLOPs are counted analytically: 2 x multiply-adds of the convolutions and dense
  layers (pooling, activations and the loss are not counted), times 3 for forward and
  backward.

The model is `omnikeras.profiles.reference_cnn` (28x28x1 input, two 3x3 convolutions of
32 and 64 channels, ~1.2M parameters). The merged path trains with `fit` and
`jit_compile=False`, as it does under `GroupedAsyncStrategy`. All sides are compute only:
no parameter server (its cost is measured by benchmarks/strategy_overhead.py).

Every side runs in processes of its own, started once and kept waiting, because thread
settings are fixed when TensorFlow's runtime starts. Round after round the sides take
turns, one at a time, and each figure is the median of the rounds' ratios, so load that
comes and goes on a shared machine weighs on all sides alike. Plain Keras without XLA is
measured too and reported on stderr. `--quick` runs two short rounds, for a correctness
check.

    .venv/bin/python benchmarks/cpu_path.py [--quick]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BATCH = 256
PROCESSES = 4
MATMUL_SIZE = 2048


# The child processes: each builds the model once, then trains when told ------------------


def child(role: str, batch: int, steps: int) -> None:
    """Serves commands on stdin: `train` (answers start and end times) and `matmul`."""
    import keras
    import numpy as np
    import tensorflow as tf

    from omnikeras.profiles.reference_cnn import reference_cnn

    model = reference_cnn()
    jit = {"jit_compile": False} if role in ("merged", "plain_no_xla") else {}
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy", **jit)
    rng = np.random.default_rng(0)
    x = rng.random((batch * steps, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, batch * steps)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    a = tf.random.normal((MATMUL_SIZE, MATMUL_SIZE))
    matmul = tf.function(lambda a: tf.matmul(a, a))
    reply({"ready": True, "training_flops": training_flops(model)})
    for command in sys.stdin:
        if command.strip() == "train":
            start = time.monotonic()
            model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
            reply({"start": start, "end": time.monotonic()})
        elif command.strip() == "matmul":
            matmul(a).numpy()
            count, start = 0, time.monotonic()
            while time.monotonic() - start < 1.5:
                matmul(a).numpy()
                count += 1
            reply({"flops": count * 2 * MATMUL_SIZE**3 / (time.monotonic() - start)})


def training_flops(model) -> int:
    """FLOPs of one training example: 2 x multiply-adds of convolutions and dense layers,
    forward, times 3 for forward and backward."""
    import keras

    forward = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            kernel_h, kernel_w, channels_in, channels_out = layer.kernel.shape
            _, height, width, _ = layer.output.shape
            forward += 2 * height * width * kernel_h * kernel_w * channels_in * channels_out
        elif isinstance(layer, keras.layers.Dense):
            forward += 2 * layer.kernel.shape[0] * layer.kernel.shape[1]
    return 3 * forward


def reply(message: dict) -> None:
    print(json.dumps(message), flush=True)


# The parent: no TensorFlow here, only the orchestration ----------------------------------


class Side:
    """Worker processes of one side, started once, each training `batch` per step."""

    def __init__(self, role: str, processes: int, batch: int, steps: int, env: dict[str, str]) -> None:
        self.role, self.batch, self.steps = role, batch, steps
        command = [sys.executable, __file__, "--child", role, "--batch", str(batch), "--steps", str(steps)]
        self.children = [
            subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(processes)
        ]
        self.training_flops = 0

    def wait_ready(self) -> None:
        for child_process in self.children:
            message = self._read(child_process)
            self.training_flops = message["training_flops"]

    def examples_per_second(self) -> float:
        """All processes train at once; examples over the time from first start to last end."""
        for child_process in self.children:
            self._send(child_process, "train")
        times = [self._read(child_process) for child_process in self.children]
        elapsed = max(t["end"] for t in times) - min(t["start"] for t in times)
        return len(self.children) * self.batch * self.steps / elapsed

    def matmul_flops(self) -> float:
        self._send(self.children[0], "matmul")
        return self._read(self.children[0])["flops"]

    def stop(self) -> None:
        for child_process in self.children:
            if child_process.stdin:
                child_process.stdin.close()
            child_process.wait(timeout=60)

    def _send(self, child_process: subprocess.Popen, command: str) -> None:
        assert child_process.stdin is not None
        child_process.stdin.write(command + "\n")
        child_process.stdin.flush()

    def _read(self, child_process: subprocess.Popen) -> dict:
        assert child_process.stdout is not None
        line = child_process.stdout.readline()
        if not line:
            raise RuntimeError(f"a {self.role} process exited with code {child_process.wait()}")
        return json.loads(line)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two short rounds, for a correctness check")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batch, args.steps)
        return 0

    from omnikeras.profiles.model_spec import REFERENCE
    from omnikeras.profiles.thread_search import search_thread_settings

    rounds, steps = (2, 2) if args.quick else (9, 8)
    # On a shared machine, other users' processes change the figures: say how busy it was.
    log(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    log(f"choosing the merged path's thread settings at batch {BATCH}")
    threads, _ = search_thread_settings(
        REFERENCE, BATCH, repeats=1 if args.quick else 3, seconds=0.3 if args.quick else 1.0, label="  "
    )
    log(f"merged path: {threads.intra_op} intra-op and {threads.inter_op} inter-op threads")

    base = {k: v for k, v in os.environ.items() if not k.startswith("TF_NUM_")}
    base |= {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
    sides = {
        "merged": Side("merged", 1, BATCH, steps, base | threads.environment()),
        "4 processes": Side("plain", PROCESSES, BATCH // PROCESSES, steps, base),
        "plain Keras": Side("plain", 1, BATCH, steps, base),
        "plain Keras, no XLA": Side("plain_no_xla", 1, BATCH, steps, base),
    }
    try:
        for side in sides.values():
            side.wait_ready()
        flops_per_example = sides["merged"].training_flops
        log(f"reference CNN: {flops_per_example / 1e6:.1f} MFLOP per training example (3 x forward)")
        ratios: dict[str, list[float]] = {"4 processes": [], "plain Keras": [], "plain Keras, no XLA": [], "matmul": []}
        names = list(sides)
        for round_index in range(rounds):
            rates: dict[str, float] = {}
            # Rotate the order, so that no side always runs right after another.
            for name in names[round_index % len(names):] + names[: round_index % len(names)]:
                rates[name] = sides[name].examples_per_second()
            matmul = sides["plain Keras"].matmul_flops()
            for name in ("4 processes", "plain Keras", "plain Keras, no XLA"):
                ratios[name].append(rates["merged"] / rates[name])
            ratios["matmul"].append(rates["merged"] * flops_per_example / matmul)
            log(
                f"round {round_index + 1}/{rounds}: examples/s merged {rates['merged']:.0f}, "
                f"4 processes {rates['4 processes']:.0f}, plain Keras {rates['plain Keras']:.0f}, "
                f"plain Keras without XLA {rates['plain Keras, no XLA']:.0f}; "
                f"merged {rates['merged'] * flops_per_example / 1e9:.1f} GFLOP/s, matmul {matmul / 1e9:.1f} GFLOP/s"
            )
    finally:
        for side in sides.values():
            side.stop()
    log(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    log(f"merged vs plain Keras without XLA (not a goal figure): {statistics.median(ratios['plain Keras, no XLA']):.3f}")
    print(json.dumps({
        "merged_vs_4_processes": round(statistics.median(ratios["4 processes"]), 3),
        "merged_vs_plain_keras": round(statistics.median(ratios["plain Keras"]), 3),
        "flops_fraction_of_matmul": round(statistics.median(ratios["matmul"]), 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
