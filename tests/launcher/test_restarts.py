"""The launcher's watch: which dead processes it restarts, and when it gives up."""

import pathlib

import pytest

from omnikeras.config import WorkerConfig
from omnikeras.launcher import launcher
from omnikeras.launcher.launcher import MAX_RESTARTS, LaunchError


class FakeChild:
    """A process whose exit the test decides: alive for `polls` polls, then `code`."""

    def __init__(self, name: str, code: int | None = None, polls: int = 0) -> None:
        self.name, self.code, self.polls = name, code, polls

    @property
    def returncode(self) -> int | None:
        if self.polls > 0:
            self.polls -= 1
            return None
        return self.code

    def describe_exit(self) -> str:
        return f"{self.name} was killed by signal 9"

    def wait_for_output(self, timeout: float = 10.0) -> None:
        pass


@pytest.fixture
def cluster(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> launcher._Cluster:
    monkeypatch.setattr(launcher, "_POLL_SECONDS", 0.0)
    cluster = launcher._Cluster(tmp_path, None, None)
    cluster.servers = [FakeChild("parameter server 0", polls=1_000)]
    cluster._server_args = [["--port", "1"]]
    start = (WorkerConfig(("127.0.0.1:1",), worker_index=1, num_workers=2), "train.py", (), {}, None)
    cluster._worker_starts = [start, start]
    return cluster


def test_a_dead_worker_is_restarted_and_the_run_succeeds_once_it_lives(cluster, capsys) -> None:
    cluster.workers = [FakeChild("the chief (worker 0)", code=0, polls=50), FakeChild("worker 1", code=-9)]
    restarted: list[str] = []

    def start_worker(config: WorkerConfig, *start: object) -> FakeChild:
        # The replacement joins training under way.
        assert config.rejoining
        restarted.append("worker 1")
        return FakeChild("worker 1", code=0, polls=5)

    cluster._start_worker = start_worker  # type: ignore[method-assign]
    assert cluster.watch() == 0
    assert restarted == ["worker 1"]
    assert "worker 1 was killed by signal 9: restarting it" in capsys.readouterr().err


def test_a_worker_that_keeps_dying_is_given_up_after_the_last_restart(cluster, capsys) -> None:
    cluster.workers = [FakeChild("the chief (worker 0)", code=0, polls=50), FakeChild("worker 1", code=-9)]
    cluster._start_worker = lambda *start: FakeChild("worker 1", code=-9)  # type: ignore[method-assign]
    assert cluster.watch() == 1
    err = capsys.readouterr().err
    assert err.count("restarting it") == MAX_RESTARTS
    assert "its group carries on without it" in err and "training finished, but" in err


def test_a_dead_server_is_restarted_on_its_port_until_the_restarts_run_out(cluster, capsys) -> None:
    cluster.workers = [FakeChild("the chief (worker 0)", polls=1_000)]
    cluster.servers = [FakeChild("parameter server 0", code=-9)]
    ports: list[list[str]] = []

    def start_server(shard: int, args: list[str], mode: str) -> tuple[FakeChild, str]:
        ports.append(args)
        return FakeChild("parameter server 0", code=-9, polls=2), "127.0.0.1:1"

    cluster._start_server = start_server  # type: ignore[method-assign]
    with pytest.raises(LaunchError, match=f"{MAX_RESTARTS + 1} times"):
        cluster.watch()
    assert ports == [["--port", "1"]] * MAX_RESTARTS
    assert capsys.readouterr().err.count("restarting it on its checkpoints") == MAX_RESTARTS
