"""Fixtures that start real omnikeras processes for end-to-end tests."""

import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class ServerProcess:
    """`omnikeras ps` in a process of its own, on a free port."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.process: subprocess.Popen[str] | None = None
        self.address = ""

    def start(self) -> "ServerProcess":
        self.process = subprocess.Popen(
            [sys.executable, "-m", "omnikeras", "ps", "--port", "0", *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            raise RuntimeError(f"server did not start: {line}{self.process.stderr.read()}")
        self.address = line.split()[-1]
        return self

    def rss_mib(self) -> float:
        """The server's resident memory."""
        assert self.process is not None
        status = pathlib.Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))) / 1024

    def stop(self) -> str:
        """Stops the server as a user would (SIGTERM); returns what it logged."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        _, stderr = self.process.communicate(timeout=30)
        return stderr

    def kill(self) -> None:
        """Kills the server with no chance to clean up."""
        assert self.process is not None
        self.process.kill()
        self.process.communicate(timeout=30)


@pytest.fixture
def start_server() -> Iterator:
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        server = ServerProcess(*args).start()
        started.append(server)
        return server

    yield start
    for server in started:
        if server.process is not None and server.process.poll() is None:
            server.process.kill()
            server.process.communicate(timeout=30)
