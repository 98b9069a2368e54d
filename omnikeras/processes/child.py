"""Child processes that can always be stopped: each in a session of its own, so that the
launcher alone decides when they end, and nothing outlives it."""

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import IO

from omnikeras.processes.console import Sink, relay

# What `omnikeras ps` prints, followed by its address, once it serves.
SERVER_READY = "omnikeras ps listening on "


class Child:
    """A process in a session of its own.

    Its output goes to `log`, or with `read_stdout` its stdout is read here (`read_line`)
    and its stderr goes to `log`; with `echo`, both go whole to `log` (opened in binary)
    and to this process's console (or `console`'s two streams), TensorFlow's native
    start-up lines left out when `quiet` (see `console.relay`). With `die_with_parent`,
    the kernel kills it when this process dies, however it dies: an actor's process that
    Ray kills takes its child with it.
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        env: dict[str, str],
        log: IO[str] | IO[bytes] | None,
        read_stdout: bool = False,
        echo: bool = False,
        quiet: bool = True,
        console: tuple[Sink, Sink] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.name = name
        self.log_path = log.name if log is not None else None
        pipe = subprocess.PIPE
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=pipe if read_stdout or echo else log,
            stderr=pipe if echo else log,
            text=not echo,
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
        self._relays = []
        if echo:
            assert self.process.stdout is not None and self.process.stderr is not None and log is not None
            self._relays = relay(self.process.stdout, self.process.stderr, log, quiet, console)  # type: ignore[arg-type]

    def wait_for_output(self, timeout: float = 10.0) -> None:
        """Waits until everything the process printed has been relayed."""
        for thread in self._relays:
            thread.join(timeout)

    def read_line(self, timeout: float) -> str:
        """The next line of stdout, or '' if none came within `timeout` seconds."""
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        return self.process.stdout.readline() if ready else ""

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def terminate(self, grace: float = 10.0) -> None:
        """SIGTERM to the whole process group, then SIGKILL after `grace` seconds."""
        if self.process.poll() is not None:
            return
        _signal_group(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL to the whole process group, at once."""
        _signal_group(self.process.pid, signal.SIGKILL)

    def describe_exit(self) -> str:
        code = self.process.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        where = f" (log: {self.log_path})" if self.log_path else ""
        return f"{self.name} {how}{where}"


class ServerStartError(RuntimeError):
    """A parameter server exited, or said nothing, before it listened."""


def start_parameter_server(
    args: Sequence[str],
    log: IO[str] | None,
    env: dict[str, str] | None = None,
    name: str = "parameter server",
    prefix: Sequence[str] = (),
    die_with_parent: bool = False,
) -> tuple[Child, str]:
    """Starts `omnikeras ps ARGS --port 0` (after `prefix`, a command that runs it) and
    returns it with the address it listens on."""
    command = [*prefix, sys.executable, "-m", "omnikeras", "ps", "--port", "0", *args]
    env = dict(env if env is not None else os.environ)
    server = Child(name, command, env, log, read_stdout=True, die_with_parent=die_with_parent)
    line = server.read_line(timeout=60)
    if not line.startswith(SERVER_READY):
        server.terminate()
        raise ServerStartError(f"{server.describe_exit()} before it listened")
    return server, line.removeprefix(SERVER_READY).strip()


_PR_SET_PDEATHSIG = 1
# Loaded before any fork: the child between fork and exec only calls into it.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass
