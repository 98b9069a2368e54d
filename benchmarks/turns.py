"""Two runs that take turns on the machine, for benchmarks that compare them.

On a shared machine whose speed drifts over seconds, runs one after the other meet
different phases of it: single rounds of `strategy_overhead.py`'s main CNN read from 0.69
to 1.55 that way. Runs that take short turns meet the same ones.

A benchmark starts its runs with `run_in_turns`, which hands each the path of a Unix
socket in `BENCHMARK_TURNS`; each run (its chief, where launched) takes a
`Turn.from_environment()` and calls `end` after its warm-up and after each of its turns:
it says so (one byte) and waits for the word to go on, idle meanwhile.
"""

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time

# Seconds for a run to start, warm up and connect, and for one turn: far more than either takes.
START_TIMEOUT_S = 600
TURN_TIMEOUT_S = 120
VARIABLE = "BENCHMARK_TURNS"
_ENDED = b"."
_GO = b"g"


class Turn:
    """The run's side: `end` ends its warm-up or a turn and waits for the next."""

    def __init__(self, path: str) -> None:
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # The other run's turn comes in between.
        self._connection.settimeout(START_TIMEOUT_S)
        self._connection.connect(path)

    @classmethod
    def from_environment(cls) -> "Turn | None":
        """The turns `run_in_turns` set this process to take, if any."""
        path = os.environ.get(VARIABLE)
        return None if path is None else cls(path)

    def end(self) -> None:
        self._connection.sendall(_ENDED)
        if self._connection.recv(1) != _GO:
            raise RuntimeError("the benchmark stopped the turns")


class _Run:
    """The benchmark's side of a run: its process, its output, and its socket at `path`."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], path: str) -> None:
        self.name = name
        self._path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(1)
        self._connection: socket.socket | None = None
        self._stdout, self._stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self._command = command
        self._process = subprocess.Popen(
            command, stdout=self._stdout, stderr=self._stderr, text=True, env=env | {VARIABLE: path}
        )

    def wait_for_turn_end(self) -> None:
        if self._connection is None:
            self._connection = self._accept()
        if self._connection.recv(1) != _ENDED:
            raise self._failure("left its turns")

    def take_turn(self) -> None:
        assert self._connection is not None
        self._connection.sendall(_GO)
        self.wait_for_turn_end()

    def finish(self) -> dict:
        """Lets the run end, and returns its `RESULT` line's object."""
        assert self._connection is not None
        self._connection.sendall(_GO)
        self._process.wait(timeout=TURN_TIMEOUT_S)
        self._stdout.seek(0)
        lines = [line for line in self._stdout.read().splitlines() if line.startswith("RESULT ")]
        if self._process.returncode != 0 or not lines:
            raise self._failure("failed")
        return json.loads(lines[-1].removeprefix("RESULT "))

    def close(self) -> None:
        for connection in (self._connection, self._listener):
            if connection is not None:
                connection.close()
        os.unlink(self._path)
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._stdout.close()
        self._stderr.close()

    def _accept(self) -> socket.socket:
        deadline = time.monotonic() + START_TIMEOUT_S
        self._listener.settimeout(1)
        while time.monotonic() < deadline:
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                if self._process.poll() is not None:
                    raise self._failure("ended before its turns") from None
                continue
            connection.settimeout(TURN_TIMEOUT_S)
            return connection
        raise self._failure(f"did not connect within {START_TIMEOUT_S} s")

    def _failure(self, what: str) -> RuntimeError:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10)
        self._stdout.seek(0)
        self._stderr.seek(0)
        return RuntimeError(
            f"the {self.name} run {what}: {' '.join(self._command)}\n"
            f"{self._stdout.read()[-2000:]}\n{self._stderr.read()[-3000:]}"
        )


def run_in_turns(commands: dict[str, list[str]], turns: int, env: dict[str, str], directory: str) -> dict[str, dict]:
    """Starts `commands` together, each with a socket of its own, and, once each has ended
    its warm-up, lets them run `turns` turns each, one at a time: in the order given, then
    the other way round, and so on. Returns each one's `RESULT` once it has ended."""
    runs: list[_Run] = []
    try:
        for name, command in commands.items():
            runs.append(_Run(name, command, env, os.path.join(directory, f"turns-{name}.sock")))
        for run in runs:
            run.wait_for_turn_end()
        for turn in range(turns):
            for run in runs if turn % 2 == 0 else reversed(runs):
                run.take_turn()
        return {run.name: run.finish() for run in runs}
    finally:
        for run in runs:
            run.close()
