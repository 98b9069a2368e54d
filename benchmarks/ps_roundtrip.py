"""Round trip and update rate of the parameter server, over loopback and shared memory.

Four figures, printed as the last line of stdout, one JSON object:

* `roundtrip_vs_echo_1M`, `roundtrip_vs_echo_25M`: the time of one worker's `push_pull`
  of 1M (25M) float32 parameters over gRPC, over the time of a bare gRPC echo of the same
  bytes, in the same chunk size, in the same run. The echo is the floor any push-then-pull protocol
  over gRPC Python can reach: a tiny service with identity (bytes) serializers whose server
  takes the whole upload, then streams it back. It stores before it forwards, as a push
  must be whole before its update can be applied and the new weights sent. The parameter
  server (one group, one worker, plain SGD) and the echo server each run in a process of
  their own. Their repetitions alternate, each `push_pull` paired with the echo next to
  it, and the figure is the median of the pairs' ratios: on a shared machine, load that
  comes and goes weighs on both halves of a pair alike, and the median drops the pairs it
  split. Progress also shows the CPU time of both (client and server process together),
  which load on the machine hardly changes.
* `same_host_roundtrip_vs_echo_25M`: the same 25M `push_pull` through the shared-memory
  exchange that a worker on the server's host uses, over the same gRPC echo: what the
  same-host path saves against the cheapest gRPC round trip.
* `pushes_per_s_8x100K`: pushes per second, in total, of 8 worker processes that
  `push_pull` 100K float32 parameters in a loop against a server with 8 groups (fully
  asynchronous: each worker's push is an update of its own), as workers on the server's
  host do (through shared memory); the median over one-second windows, for the same
  reason. Progress also shows the rate over gRPC. Processes rather than threads, as real workers are: in
  one process, the workers' encoding and decoding would take turns on one GIL.

Progress goes to stderr. `--quick` runs a few repetitions only, for a correctness check.

    .venv/bin/python benchmarks/ps_roundtrip.py [--quick]
"""

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import numpy as np

from omnikeras.parameter_server import Hyperparameters, ParameterServerClient, tensors
from omnikeras.processes import SERVER_READY

_ECHO_METHOD = "/omnikeras.bench.Echo/Echo"
_ECHO_READY = "echo listening on "
_HYPERPARAMETERS = Hyperparameters(learning_rate=1e-3)


@dataclass(frozen=True)
class Settings:
    roundtrip_sizes: tuple[int, ...]
    # Timed repetitions of each size, for the echo and for the server alike.
    repetitions: dict[int, int]
    update_workers: int
    update_parameters: int
    update_seconds: float


FULL = Settings(
    roundtrip_sizes=(1_000_000, 25_000_000),
    repetitions={1_000_000: 61, 25_000_000: 41},
    update_workers=8,
    update_parameters=100_000,
    update_seconds=6.0,
)
QUICK = Settings(
    roundtrip_sizes=(1_000_000, 25_000_000),
    repetitions={1_000_000: 3, 25_000_000: 1},
    update_workers=8,
    update_parameters=100_000,
    update_seconds=1.0,
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# The echo service ------------------------------------------------------------------------


def serve_echo() -> int:
    """Runs the echo server until stdin closes; prints its address on stdout first."""

    def echo(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        received = list(requests)
        yield from received

    # The same thread pool as the parameter server, so neither has an edge in scheduling.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    handler = grpc.method_handlers_generic_handler(
        "omnikeras.bench.Echo", {"Echo": grpc.stream_stream_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"{_ECHO_READY}127.0.0.1:{port}", flush=True)
    sys.stdin.read()
    server.stop(0)
    return 0


class EchoClient:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        # No serializers: the chunks travel as the bytes they are.
        self._echo = self.channel.stream_stream(_ECHO_METHOD)

    def round_trip(self, chunks: list[bytes]) -> int:
        return sum(len(reply) for reply in self._echo(iter(chunks), timeout=300))

    def close(self) -> None:
        self.channel.close()


# Processes -------------------------------------------------------------------------------


class Process:
    """A child that prints `ready_prefix + address` on stdout once it serves."""

    def __init__(self, argv: list[str], ready_prefix: str) -> None:
        self._log = tempfile.TemporaryFile(mode="w+")
        self.popen = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True
        )
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line.startswith(ready_prefix):
                self.address = line[len(ready_prefix) :].strip()
                return
        self.stop()
        raise RuntimeError(f"{argv} exited before serving:\n{self.log_tail()}")

    def log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read()[-4000:]

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            assert self.popen.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self.popen.stdin.close()
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()


def start_ps(groups: int) -> Process:
    return Process(
        [sys.executable, "-m", "omnikeras", "ps", "--port", "0", "--groups", str(groups)],
        SERVER_READY,
    )


def start_echo() -> Process:
    return Process([sys.executable, __file__, "--serve-echo"], _ECHO_READY)


# Round trip ------------------------------------------------------------------------------


def gradient(parameters: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1e-3, parameters).astype(np.float32)


def echo_chunks(array: np.ndarray) -> list[bytes]:
    """The bytes of `array` cut as `tensors.encode` cuts them."""
    raw = memoryview(array).cast("B")
    return [
        raw[offset : offset + tensors.CHUNK_BYTES].tobytes()
        for offset in range(0, len(raw), tensors.CHUNK_BYTES)
    ]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Timings:
    """Wall-clock seconds of each call, and the CPU seconds of all of them, this process's
    and the server's together."""

    server_pid: int
    wall: list[float] = field(default_factory=list)
    cpu: float = 0.0

    def time(self, call: Callable[[], object]) -> None:
        cpu_before = time.process_time() + cpu_seconds(self.server_pid)
        started = time.perf_counter()
        call()
        self.wall.append(time.perf_counter() - started)
        self.cpu += time.process_time() + cpu_seconds(self.server_pid) - cpu_before


def roundtrip_ratio(
    parameters: int, repetitions: int, echo: EchoClient, echo_pid: int, shared_memory: bool
) -> float:
    ps = start_ps(groups=1)
    try:
        with ParameterServerClient([ps.address], shared_memory=shared_memory) as client:
            client.register()
            client.init_model({"w": np.zeros(parameters, np.float32)}, _HYPERPARAMETERS)
            grad = gradient(parameters, seed=parameters)
            chunks = echo_chunks(grad)
            step = 0

            def push_pull() -> None:
                nonlocal step
                step += 1
                _, pulled = client.push_pull({"w": grad}, step=step, example_count=1)
                assert pulled.weights["w"].shape == (parameters,)

            def echo_round_trip() -> None:
                assert echo.round_trip(chunks) == grad.nbytes

            # Untimed: connections, caches and the allocator warm up.
            push_pull()
            echo_round_trip()
            if bool(client.shared_memory_shards) != shared_memory:
                raise RuntimeError(f"push_pull did not take the {transport(shared_memory)} path")
            ours, bare = Timings(ps.popen.pid), Timings(echo_pid)
            for repetition in range(repetitions):
                # Alternate which goes first, so a trend in the noise weighs on both.
                if repetition % 2:
                    ours.time(push_pull)
                    bare.time(echo_round_trip)
                else:
                    bare.time(echo_round_trip)
                    ours.time(push_pull)
    finally:
        ps.stop()
    ratio = statistics.median(p / e for p, e in zip(ours.wall, bare.wall))
    ours_ms, bare_ms = statistics.median(ours.wall) * 1e3, statistics.median(bare.wall) * 1e3
    log(
        f"{parameters:>11,} float32 ({grad.nbytes / 2**20:.1f} MiB, {len(chunks)} chunks), "
        f"{repetitions} pairs: push_pull over {transport(shared_memory)} median {ours_ms:.1f} ms (min {min(ours.wall) * 1e3:.1f}), "
        f"echo median {bare_ms:.1f} ms (min {min(bare.wall) * 1e3:.1f}); median ratio {ratio:.3f}, "
        f"ratio of medians {ours_ms / bare_ms:.3f}, ratio of minima "
        f"{min(ours.wall) / min(bare.wall):.3f}; CPU per round trip {ours.cpu / repetitions * 1e3:.1f} ms "
        f"vs {bare.cpu / repetitions * 1e3:.1f} ms, ratio {ours.cpu / bare.cpu:.3f}"
    )
    return ratio


# Update rate -----------------------------------------------------------------------------


def transport(shared_memory: bool) -> str:
    return "shared memory" if shared_memory else "gRPC"


def push_worker(address: str, parameters: int, seconds: float, shared_memory: bool) -> int:
    """One worker of the update-rate run.

    Prints "ready" once registered and warmed up, waits for a line on stdin (the start
    signal), pushes for `seconds`, then prints when (`time.monotonic`, the same clock in
    every process) each push completed.
    """
    with ParameterServerClient([address], shared_memory=shared_memory) as client:
        client.register()
        client.pull(wait_for_model=30)
        grad = gradient(parameters, seed=os.getpid())
        step = 0
        for _ in range(3):
            step += 1
            client.push_pull({"w": grad}, step=step, example_count=1)
        print("ready", flush=True)
        sys.stdin.readline()
        completed = []
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            step += 1
            client.push_pull({"w": grad}, step=step, example_count=1)
            completed.append(time.monotonic())
        print(json.dumps({"completed": completed}), flush=True)
        client.deregister()
    return 0


def update_rate(workers: int, parameters: int, seconds: float, shared_memory: bool) -> float:
    ps = start_ps(groups=workers)
    try:
        with ParameterServerClient([ps.address]) as client:
            client.init_model({"w": np.zeros(parameters, np.float32)}, _HYPERPARAMETERS)
        argv = [
            sys.executable, __file__, "--push-worker", ps.address,
            "--parameters", str(parameters), "--seconds", str(seconds),
        ] + ([] if shared_memory else ["--no-shared-memory"])  # fmt: skip
        children = [
            subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(workers)
        ]
        try:
            for child in children:
                assert child.stdout is not None
                if child.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"a push worker failed to start:\n{ps.log_tail()}")
            # Every worker gets the start signal before any has run far ahead.
            started = time.monotonic()
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            completed = []
            for child in children:
                assert child.stdout is not None
                completed.append(json.loads(child.stdout.readline())["completed"])
                child.wait(60)
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
    finally:
        ps.stop()
    windows = [0] * max(int(seconds), 1)
    for times in completed:
        for at in times:
            window = int(at - started)
            if window < len(windows):
                windows[window] += 1
    rate = statistics.median(windows)
    log(
        f"{workers} workers x {parameters:,} float32, {workers} groups, {transport(shared_memory)}: {rate:.0f} pushes/s "
        f"(median of one-second windows {windows}; per worker "
        f"{sorted(len(times) for times in completed)} in {seconds:.0f} s)"
    )
    return rate


# Main ------------------------------------------------------------------------------------


def run(settings: Settings) -> dict[str, float]:
    results: dict[str, float] = {}
    echo_server = start_echo()
    echo = EchoClient(echo_server.address)
    try:
        for parameters in settings.roundtrip_sizes:
            ratio = roundtrip_ratio(
                parameters, settings.repetitions[parameters], echo, echo_server.popen.pid, shared_memory=False
            )
            results[f"roundtrip_vs_echo_{parameters // 1_000_000}M"] = round(ratio, 3)
        parameters = settings.roundtrip_sizes[-1]
        ratio = roundtrip_ratio(
            parameters, settings.repetitions[parameters], echo, echo_server.popen.pid, shared_memory=True
        )
        results[f"same_host_roundtrip_vs_echo_{parameters // 1_000_000}M"] = round(ratio, 3)
    finally:
        echo.close()
        echo_server.stop()
    update = (settings.update_workers, settings.update_parameters, settings.update_seconds)
    update_rate(*update, shared_memory=False)
    rate = update_rate(*update, shared_memory=True)
    key = f"pushes_per_s_{settings.update_workers}x{settings.update_parameters // 1000}K"
    results[key] = round(float(rate), 1)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few repetitions only")
    # Internal: the roles of the child processes.
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--push-worker", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--parameters", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--no-shared-memory", dest="shared_memory", action="store_false", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        return serve_echo()
    if args.push_worker:
        return push_worker(args.push_worker, args.parameters, args.seconds, args.shared_memory)
    results = run(QUICK if args.quick else FULL)
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
