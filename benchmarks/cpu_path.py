"""The batch-merging CPU path against co-located worker processes and plain Keras.

Three figures, printed as the last line of stdout, one JSON object:

* `merged_vs_4_processes`: examples/s of the merged path as users run it (ONE worker
  process training the group's whole batch of 256 per step under `GroupedAsyncStrategy`,
  through a parameter server of its own, with the thread settings that
  `omnikeras.profiles` measures here first) over examples/s of 4 worker processes through
  one parameter server, each its own group (fully asynchronous: nobody waits), training
  a batch of 64 each at the same time with the thread settings the launcher gives them
  (`omnikeras launch --workers 4 --groups 4 --no-merge`).
* `merged_vs_plain_keras`: the merged path over plain Keras `fit` in one process with
  TensorFlow's default threads and Keras' defaults (`jit_compile="auto"`, which leaves XLA
  off on a machine without a GPU and turns it on where there is one), same batch of 256,
  no parameter server: what the user would run instead.
* `flops_fraction_of_matmul`: the merged path's training FLOP/s over the FLOP/s of a
  2048x2048 float32 matmul with TensorFlow's default threads, measured in the same rounds.
  Training FLOPs are counted analytically: 2 x multiply-adds of the convolutions and dense
  layers (pooling, activations and the loss are not counted), times 3 for forward and
  backward.

The model is `omnikeras.profiles.reference_cnn` (28x28x1 input, two 3x3 convolutions of
32 and 64 channels, ~1.2M parameters). The strategy's workers exchange with their
parameter server (an `omnikeras ps` process) through shared memory, as on any single host.
Each side's rate counts the steps of a round from the end of its first step to the end of
its last, so that joining and leaving the cluster at every `fit` is not counted.

Every side runs in processes of its own, started once and kept waiting, because thread
settings are fixed when TensorFlow's runtime starts. Round after round the sides take
turns, one at a time, and each figure is the median of the rounds' ratios, so load that
comes and goes on a shared machine weighs on all sides alike. Plain Keras without XLA is
measured too and reported on stderr. `--quick` runs one short round, for a correctness
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


def child(role: str, batch: int, steps: int, server: str | None, index: int, workers: int) -> None:
    """Serves commands on stdin: `train` (answers the examples trained and when the first
    and last steps ended) and `matmul`."""
    import contextlib

    import keras
    import numpy as np
    import tensorflow as tf

    import omnikeras
    from omnikeras.profiles.reference_cnn import reference_cnn

    class StepClock(keras.callbacks.Callback):
        """`time.monotonic()` at the end of every training step."""

        def __init__(self) -> None:
            super().__init__()
            self.ends: list[float] = []

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.ends.append(time.monotonic())

    scope = contextlib.nullcontext()
    if server is not None:
        config = omnikeras.WorkerConfig((server,), worker_index=index, num_workers=workers)
        scope = omnikeras.GroupedAsyncStrategy(config).scope()
    with scope:
        model = reference_cnn()
        jit = {} if role == "plain" else {"jit_compile": False}
        model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy", **jit)
    rng = np.random.default_rng(0)
    # Under the strategy, each of `workers` groups takes every `workers`-th batch.
    x = rng.random((batch * steps * workers, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, batch * steps * workers)
    clock = StepClock()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[clock])
    a = tf.random.normal((MATMUL_SIZE, MATMUL_SIZE))
    matmul = tf.function(lambda a: tf.matmul(a, a))
    reply({"ready": True, "training_flops": training_flops(model)})
    for command in sys.stdin:
        if command.strip() == "train":
            clock.ends.clear()
            model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[clock])
            reply({"examples": batch * (len(clock.ends) - 1), "start": clock.ends[0], "end": clock.ends[-1]})
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
    """Worker processes of one side, started once, each training `batch` per step; with
    `server`, through that parameter server, as the workers of one cluster."""

    def __init__(
        self, role: str, batch: int, steps: int, environments: list[dict[str, str]], server: str | None = None
    ) -> None:
        self.role, self.batch, self.steps = role, batch, steps
        workers = len(environments)
        self.children = []
        for index, env in enumerate(environments):
            command = [
                sys.executable, __file__, "--child", role, "--batch", str(batch), "--steps", str(steps),
                "--index", str(index), "--workers", str(workers),
            ] + (["--server", server] if server else [])  # fmt: skip
            self.children.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
        self.training_flops = 0

    def wait_ready(self) -> None:
        for child_process in self.children:
            message = self._read(child_process)
            self.training_flops = message["training_flops"]

    def examples_per_second(self) -> float:
        """All processes train at once; their examples over the time from the first end of
        a first step to the last end of a last step."""
        for child_process in self.children:
            self._send(child_process, "train")
        rounds = [self._read(child_process) for child_process in self.children]
        elapsed = max(r["end"] for r in rounds) - min(r["start"] for r in rounds)
        return sum(r["examples"] for r in rounds) / elapsed

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
    parser.add_argument("--quick", action="store_true", help="one short round, for a correctness check")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--server", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batch, args.steps, args.server, args.index, args.workers)
        return 0

    from omnikeras.launcher.worker_plan import plan_workers
    from omnikeras.processes import start_parameter_server
    from omnikeras.profiles.hardware import cpu_count
    from omnikeras.profiles.model_spec import REFERENCE
    from omnikeras.profiles.thread_search import search_thread_settings

    rounds, steps = (1, 2) if args.quick else (9, 8)
    # On a shared machine, other users' processes change the figures: say how busy it was.
    log(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    log(f"choosing the merged path's thread settings at batch {BATCH}")
    threads, _ = search_thread_settings(
        REFERENCE, BATCH, repeats=1 if args.quick else 3, seconds=0.3 if args.quick else 1.0, label="  "
    )
    log(f"merged path: {threads.intra_op} intra-op and {threads.inter_op} inter-op threads")

    base = {k: v for k, v in os.environ.items() if not k.startswith("TF_NUM_")}
    base |= {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "-1"}
    unmerged = plan_workers(PROCESSES, PROCESSES, gpus=0, cores=cpu_count(), merge=False, threads=threads)
    quiet = open(os.devnull, "w")
    (merged_server, merged_address), (shared_server, shared_address) = (
        start_parameter_server(["--groups", str(groups)], log=quiet) for groups in (1, PROCESSES)
    )
    sides = {
        "merged": Side("merged", BATCH, steps, [base | threads.environment()], merged_address),
        "4 processes": Side(
            "worker", BATCH // PROCESSES, steps, [base | env for env in unmerged.environments], shared_address
        ),
        "plain Keras": Side("plain", BATCH, steps, [base]),
        "plain Keras, no XLA": Side("plain_no_xla", BATCH, steps, [base]),
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
        for server in (merged_server, shared_server):
            server.terminate()
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
