"""The fault schedule, against a fake cluster that records what was done to it."""

import threading
import time

from omnikeras.emulation import ClusterSpec, FaultInjector, FaultSpec


class FakeCluster:
    def __init__(self) -> None:
        self.spec = ClusterSpec.load("mixed")
        self.events: list[tuple[float, str]] = []
        self.started = time.monotonic()

    def _record(self, what: str) -> None:
        self.events.append((time.monotonic() - self.started, what))

    def pause(self, host) -> None:
        self._record(f"pause {host.name}")

    def resume(self, host) -> None:
        self._record(f"resume {host.name}")

    def cut(self, shard: int) -> None:
        self._record(f"cut {shard}")

    def restore(self, shard: int) -> None:
        self._record(f"restore {shard}")


def _injector(cluster: FakeCluster, faults: list[str], said: list[str], until_ready=None) -> FaultInjector:
    return FaultInjector(
        cluster,  # type: ignore[arg-type]
        [FaultSpec.parse(f) for f in faults],
        kill_worker=lambda host: cluster._record(f"kill worker {host}"),
        kill_server=lambda shard: cluster._record(f"kill server {shard}"),
        say=said.append,
        until_ready=until_ready,
    )


def test_faults_happen_in_order_on_time_and_are_undone() -> None:
    cluster, said = FakeCluster(), []
    injector = _injector(cluster, ["kill-ps:0@0.6", "pause:slow-1@0.1+0.3", "cut-link:0@0.2+0.2", "kill-worker:fast@0.5"], said)
    injector.start()
    time.sleep(1.0)
    injector.stop()
    assert [what for _, what in cluster.events] == [
        "pause slow-1", "cut 0", "resume slow-1", "restore 0", "kill worker fast", "kill server 0",
    ]
    times = dict((what, at) for at, what in cluster.events)
    assert 0.05 < times["pause slow-1"] < 0.3 and 0.35 < times["resume slow-1"] < 0.6
    assert said[0].startswith("fault at 0.1 s: pause host slow-1 for 0.3 s")
    assert any("link of parameter server 0 restored" in line for line in said)
    assert len(said) == 6


def test_stopping_early_undoes_pauses_and_cuts_still_in_effect() -> None:
    cluster, said = FakeCluster(), []
    injector = _injector(cluster, ["pause:fast@0+30", "cut-link:0@0+30", "kill-worker:slow-0@20"], said)
    injector.start()
    time.sleep(0.3)
    injector.stop()
    assert sorted(what for _, what in cluster.events) == ["cut 0", "pause fast", "restore 0", "resume fast"]
    assert not any(thread.name == "fault-injector" for thread in threading.enumerate())


def test_a_fault_that_fails_is_reported_and_the_rest_go_on() -> None:
    cluster, said = FakeCluster(), []

    def broken(host) -> None:
        raise OSError("freezer is gone")

    cluster.pause = broken  # type: ignore[method-assign]
    injector = _injector(cluster, ["pause:fast@0+1", "kill-ps:0@0.1"], said)
    injector.start()
    time.sleep(0.4)
    injector.stop()
    assert "could not pause host fast for 1 s: freezer is gone" in said[0]
    assert [what for _, what in cluster.events] == ["kill server 0"]


def test_the_clock_starts_when_training_begins_and_not_before() -> None:
    cluster, said = FakeCluster(), []
    injector = _injector(cluster, ["kill-ps:0@0.1"], said, until_ready=lambda stopping: not stopping.wait(0.5))
    injector.start()
    time.sleep(1.0)
    injector.stop()
    ((at, what),) = cluster.events
    assert what == "kill server 0" and 0.55 < at < 0.9
    assert said[0] == "faults: every worker has joined; the fault clock starts now"


def test_nothing_is_injected_when_training_never_begins() -> None:
    cluster, said = FakeCluster(), []
    injector = _injector(cluster, ["kill-ps:0@0"], said, until_ready=lambda stopping: False)
    injector.start()
    time.sleep(0.2)
    injector.stop()
    assert cluster.events == []
    assert said == ["faults: training never began, so none was injected"]
