"""Fixtures that start real omnikeras processes for end-to-end tests."""

import atexit
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from omnikeras.processes import Child, start_parameter_server

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The suite's launches measure the CPU thread settings under the suite's own load: into a
# cache of the suite's, not the user's, whose later launches would take them (one intra-op
# thread, measured while the suite ran, slowed a launched step by a third).
if "OMNIKERAS_CACHE_DIR" not in os.environ:
    os.environ["OMNIKERAS_CACHE_DIR"] = tempfile.mkdtemp(prefix="omnikeras-test-cache-")
    atexit.register(shutil.rmtree, os.environ["OMNIKERAS_CACHE_DIR"], ignore_errors=True)
# Before anything imports Ray: every Ray cluster, driver and worker of the tests on loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
# A suite started in the background (`make test &`, nohup) inherits SIGINT ignored, and so
# would every launcher it starts: the Ctrl-C tests would find it deaf. Handled here, SIGINT
# reaches each child at its default, as from a terminal.
signal.signal(signal.SIGINT, signal.default_int_handler)


class ServerProcess:
    """`omnikeras ps` in a process of its own, on a free port, logging to a file."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.child: Child | None = None
        self.address = ""
        self._log = tempfile.NamedTemporaryFile("w+", prefix="omnikeras-ps-", suffix=".log")

    @property
    def process(self) -> subprocess.Popen:
        assert self.child is not None
        return self.child.process

    def start(self) -> "ServerProcess":
        self.child, self.address = start_parameter_server(self.args, self._log)
        return self

    def rss_mib(self) -> float:
        """The server's resident memory."""
        status = pathlib.Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))) / 1024

    def stop(self) -> str:
        """Stops the server as a user would (SIGTERM); returns what it logged."""
        assert self.child is not None
        self.child.terminate(grace=30)
        return self.log()

    def kill(self) -> None:
        """Kills the server with no chance to clean up."""
        assert self.child is not None
        self.child.kill()
        self.process.wait(timeout=30)

    def log(self) -> str:
        self._log.flush()
        return pathlib.Path(self._log.name).read_text()


@pytest.fixture
def start_server() -> Iterator:
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        server = ServerProcess(*args).start()
        started.append(server)
        return server

    yield start
    for server in started:
        if server.child is not None and server.process.poll() is None:
            server.kill()
