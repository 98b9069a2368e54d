"""Where the time of a training step through the parameter server goes.

Trains one model (the main job's CNN, or `--model reference`) in this process, batch 64,
with SGD(0.01, momentum 0.9) or Keras' default Adam (`--optimizer adam`), against an
`omnikeras ps` process of its own, in four ways that alternate round after round: plain
Keras; `GroupedAsyncStrategy` whose client is replaced by one that hands back
weights prepared beforehand (what the hook and the worker cost alone); the
strategy over gRPC; the strategy through shared memory (the default on one host). For
the two real exchanges it times, per step, the exchange as the step sees it (the
`numpy_function` body), and inside it the copy of the gradients into the segment and the
wait for the server's reply (what is left of it after the worker read its next share
ahead, which it does first); the server reports its own mean time per update. Each way's
cost over plain Keras in the table is the median over the rounds of its difference from
plain Keras in the same round, since the machine's speed drifts between rounds.

Progress and the table go to stderr; the last line of stdout is one JSON object of
milliseconds per step: `{"plain_ms", "hook_only_ms", "grpc_ms", "shared_memory_ms",
"grpc_exchange_ms", "shared_memory_exchange_ms", "shared_memory_copy_in_ms",
"shared_memory_wait_ms", "server_update_ms"}`.

    .venv/bin/python benchmarks/step_breakdown.py [--model reference] [--optimizer adam] [--quick]
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import omnikeras
from omnikeras.parameter_server import ParameterServerClient, PullResult, PushResult, shared_memory_client
from omnikeras.processes import start_parameter_server
from omnikeras.profiles.reference_cnn import reference_cnn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import fashion_mnist as fashion_mnist_example

BATCH = 64
MODELS = {"main": fashion_mnist_example.build_model, "reference": reference_cnn}


class StepClock(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.ends.append(time.perf_counter())


class Stopwatch:
    """Seconds spent in each call of the wrapped functions, by name."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}

    def wrap(self, name: str, function: Callable) -> Callable:
        times = self.seconds.setdefault(name, [])

        def timed(*args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                times.append(time.perf_counter() - started)

        return timed

    def mean_ms(self, name: str, skip: int) -> float:
        times = self.seconds.get(name, [])[skip:]
        return statistics.fmean(times) * 1e3 if times else float("nan")

    def clear(self) -> None:
        for times in self.seconds.values():
            times.clear()


class PreparedReplies:
    """Stands in for a client: every push_pull gets weights prepared beforehand, off a
    64-byte boundary as the segment's are (TensorFlow copies them), and the next batch,
    named as a server's reply would name it."""

    def __init__(self, client: ParameterServerClient) -> None:
        self._client = client
        self._weights: dict[str, np.ndarray] = {}
        self._ahead: dict[str, np.ndarray] = {}

    def write_ahead(self, gradients: dict[str, np.ndarray]) -> None:
        self._ahead = dict(gradients)

    def push_pull(
        self,
        gradients: dict[str, np.ndarray],
        step: int,
        example_count: int,
        batch: int | None = None,
        loss: float | None = None,
        skip_update: bool = False,
        learning_rate: float | None = None,
        while_waiting: Callable[[], None] | None = None,
    ) -> tuple[PushResult, PullResult]:
        gradients, self._ahead = {**self._ahead, **gradients}, {}
        if while_waiting is not None:
            # With no server to wait for, the worker's own work in the wait is all there is.
            while_waiting()
        for name, gradient in gradients.items():
            if name not in self._weights:
                room = np.zeros(gradient.nbytes + 64, np.uint8)
                start = (-room.ctypes.data) % 64 + 16
                self._weights[name] = room[start : start + gradient.nbytes].view(gradient.dtype).reshape(gradient.shape)
        worker = self._client.worker_id
        assert worker is not None
        result = PushResult(step, 0, 1, next_batch=(batch or 0) + 1, next_members=(worker,))
        return result, PullResult(step, self._weights)

    def __getattr__(self, name: str) -> object:
        return getattr(self._client, name)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="main")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--quick", action="store_true", help="one short round, for a correctness check")
    args = parser.parse_args()
    rounds, steps, warmup = (1, 12, 4) if args.quick else (5, 200, 20)
    build = MODELS[args.model]

    (x, y), _ = omnikeras.datasets.fashion_mnist()
    x, y = x[: BATCH * steps], y[: BATCH * steps]
    watch = Stopwatch()
    # The two parts of a push_pull through shared memory: the worker's copy of its
    # gradients into the segment, and everything until the reply (the server's work).
    copy_in, reply = shared_memory_client.parallel.copy, shared_memory_client.shared_memory.receive
    shared_memory_client.parallel.copy = watch.wrap("copy_in", copy_in)
    shared_memory_client.shared_memory.receive = watch.wrap("wait", reply)

    def compiled() -> keras.Model:
        model = build()
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9) if args.optimizer == "sgd" else keras.optimizers.Adam()
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
        return model

    servers = []
    models: dict[str, keras.Model] = {"plain": compiled()}
    strategies = {}
    for name, shared_memory in (("hook only", True), ("gRPC", False), ("shared memory", True)):
        server, address = start_parameter_server([], log=open(os.devnull, "w"))
        servers.append(server)
        strategy = omnikeras.GroupedAsyncStrategy(omnikeras.WorkerConfig((address,), shared_memory=shared_memory))
        with strategy.scope():
            models[name] = compiled()
        strategies[name] = strategy
        strategy.worker.push_pull = watch.wrap(name, strategy.worker.push_pull)
    hook_only = strategies["hook only"].worker
    hook_only.client = PreparedReplies(hook_only.client)
    step_ms: dict[str, list[float]] = {name: [] for name in models}
    exchange_ms: dict[str, list[float]] = {"gRPC": [], "shared memory": [], "copy_in": [], "wait": []}
    try:
        for round_index in range(rounds):
            for name, model in models.items():
                watch.clear()
                clock = StepClock()
                model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[clock])
                times = [b - a for a, b in zip(clock.ends[warmup:], clock.ends[warmup + 1 :])]
                step_ms[name].append(statistics.fmean(times) * 1e3)
                if name in ("gRPC", "shared memory"):
                    exchange_ms[name].append(watch.mean_ms(name, warmup))
                if name == "shared memory":
                    exchange_ms["copy_in"].append(watch.mean_ms("copy_in", warmup) * len(model.trainable_variables))
                    exchange_ms["wait"].append(watch.mean_ms("wait", warmup))
            log(f"round {round_index + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.2f} ms/step" for n, v in step_ms.items()))
        server_update_ms = strategies["shared memory"].worker.client.stats()[0].mean_apply_seconds * 1e3
    finally:
        for server in servers:
            server.terminate()

    step = {name: statistics.median(values) for name, values in step_ms.items()}
    # Each way against plain Keras in the same round: the machine's speed drifts from
    # round to round by more than the differences measured.
    added = {
        name: statistics.median(v - p for v, p in zip(values, step_ms["plain"], strict=True))
        for name, values in step_ms.items()
    }
    exchange = {name: statistics.median(values) for name, values in exchange_ms.items()}
    log(
        f"\n{args.model} CNN ({models['plain'].count_params():,} parameters) with {args.optimizer}, batch {BATCH}, "
        f"medians of {rounds} rounds:"
    )
    for name, label in (
        ("plain", "plain Keras"),
        ("hook only", "strategy, exchange replaced"),
        ("gRPC", "strategy over gRPC"),
        ("shared memory", "strategy through shared memory"),
    ):
        log(f"  {label:<32s}{step[name]:7.2f} ms/step ({added[name]:+.2f} in the same round)")
    log(f"  the exchange over gRPC          {exchange['gRPC']:7.2f} ms")
    log(
        f"  the exchange, shared memory     {exchange['shared memory']:7.2f} ms: gradients into the segment "
        f"{exchange['copy_in']:.2f}, waiting for the reply {exchange['wait']:.2f} "
        f"(of which the server's update {server_update_ms:.2f})"
    )
    print(json.dumps({
        "plain_ms": round(step["plain"], 3),
        "hook_only_ms": round(step["hook only"], 3),
        "grpc_ms": round(step["gRPC"], 3),
        "shared_memory_ms": round(step["shared memory"], 3),
        "grpc_exchange_ms": round(exchange["gRPC"], 3),
        "shared_memory_exchange_ms": round(exchange["shared memory"], 3),
        "shared_memory_copy_in_ms": round(exchange["copy_in"], 3),
        "shared_memory_wait_ms": round(exchange["wait"], 3),
        "server_update_ms": round(server_update_ms, 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
