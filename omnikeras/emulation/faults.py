"""Faults injected into an emulated cluster on a schedule, each one reported when it
happens."""

import threading
import time
from collections.abc import Callable, Sequence

from omnikeras.emulation.cluster import EmulatedCluster
from omnikeras.emulation.spec import FaultSpec


class FaultInjector:
    """Runs a fault schedule in a thread of its own: from `start` on, it waits until
    training begins (`until_ready`), then injects each fault at its time.

    Pauses and cuts are undone after their seconds, and at `stop` at the latest, so a run
    never ends with a host frozen or a link cut.

    Args:
        cluster: The emulated cluster to act on.
        faults: The schedule; `at` counts from the moment `until_ready` returns.
        kill_worker: Kills the worker process of the named host.
        kill_server: Kills the parameter-server shard of the given index.
        say: Where each fault is reported, with the time it happened.
        until_ready: Waits until training has begun; returns False if it gave up, or if
            the event it is given is set (the injector is stopping). None starts the
            clock at once.
    """

    def __init__(
        self,
        cluster: EmulatedCluster,
        faults: Sequence[FaultSpec],
        kill_worker: Callable[[str], None],
        kill_server: Callable[[int], None],
        say: Callable[[str], None],
        until_ready: Callable[[threading.Event], bool] | None = None,
    ) -> None:
        self.cluster = cluster
        self.faults = sorted(faults, key=lambda fault: fault.at)
        self._kill_worker = kill_worker
        self._kill_server = kill_server
        self._say = say
        self._until_ready = until_ready
        self._stopping = threading.Event()
        self._undo: list[tuple[float, Callable[[], None]]] = []
        self._thread = threading.Thread(target=self._run, name="fault-injector", daemon=True)
        self._started = 0.0

    def start(self) -> None:
        if self.faults:
            self._thread.start()

    def stop(self) -> None:
        """Stops injecting and undoes the pauses and cuts still in effect."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        for _, undo in self._undo:
            undo()
        self._undo.clear()

    def _run(self) -> None:
        if self._until_ready is not None:
            if not self._until_ready(self._stopping):
                if not self._stopping.is_set():
                    self._say("faults: training never began, so none was injected")
                return
            self._say("faults: every worker has joined; the fault clock starts now")
        self._started = time.monotonic()
        pending = list(self.faults)
        while pending or self._undo:
            now = time.monotonic() - self._started
            due = [pending[0].at] if pending else []
            due += [at for at, _ in self._undo]
            if self._stopping.wait(max(0.0, min(due) - now)):
                return
            now = time.monotonic() - self._started
            for at, undo in [u for u in self._undo if u[0] <= now]:
                undo()
                self._undo.remove((at, undo))
            while pending and pending[0].at <= now:
                self._inject(pending.pop(0), now)

    def _inject(self, fault: FaultSpec, now: float) -> None:
        try:
            if fault.kind == "pause":
                host = next(h for h in self.cluster.spec.hosts if h.name == fault.target)
                self.cluster.pause(host)
                self._later(now + fault.seconds, lambda: self._end(f"host {host.name} resumed", lambda: self.cluster.resume(host)))
            elif fault.kind == "cut_link":
                shard = int(fault.target)
                self.cluster.cut(shard)
                self._later(
                    now + fault.seconds,
                    lambda: self._end(f"link of parameter server {shard} restored", lambda: self.cluster.restore(shard)),
                )
            elif fault.kind == "kill_worker":
                self._kill_worker(fault.target)
            else:
                self._kill_server(int(fault.target))
        except Exception as error:
            self._say(f"fault at {now:.1f} s: could not {fault.describe()}: {error}")
            return
        self._say(f"fault at {now:.1f} s: {fault.describe()}")

    def _later(self, at: float, undo: Callable[[], None]) -> None:
        self._undo.append((at, undo))

    def _end(self, what: str, undo: Callable[[], None]) -> None:
        undo()
        self._say(f"fault at {time.monotonic() - self._started:.1f} s: {what}")
