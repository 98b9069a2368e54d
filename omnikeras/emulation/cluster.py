"""The kernel side of an emulated cluster: one private network namespace whose loopback
carries every connection, a shaped link per parameter server, and cgroups per host."""

import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from types import TracebackType

from omnikeras.emulation.spec import ClusterSpec, HostSpec

CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
_PREFIX = "omnikeras-"
_CFS_PERIOD_US = 100_000
# Every loopback packet may be this large; htb's quantum and burst must hold one.
_LOOPBACK_MTU = 65536


class EmulationError(RuntimeError):
    """The machine cannot emulate the cluster; the message names what is missing."""


def missing_requirements(spec: ClusterSpec) -> list[str]:
    """What this machine lacks to emulate `spec`; empty when nothing is missing."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, traffic shaping and cgroups need it)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            missing.append(f"the `{tool}` command (iproute2)")
    probes = {"cpu": "cpu.cfs_quota_us", "freezer": "cgroup.procs"}
    if any(host.cpuset for host in spec.hosts):
        probes["cpuset"] = "cpuset.cpus"
    for controller, probe in probes.items():
        if not (CGROUP_ROOT / controller / probe).exists():
            missing.append(f"the cgroup v1 {controller} controller at {CGROUP_ROOT / controller}")
    return missing


class EmulatedCluster:
    """A network namespace, a shaped link per parameter server and a cgroup per host,
    made on entering and removed on leaving, also after an error or Ctrl-C.

    Every process of the run starts through `command`, which puts it into the namespace
    (and, for a host's worker, into the host's cgroups). The namespace and cgroups are
    named after this process and a random suffix, so runs side by side never meet; a
    run whose launcher died is cleaned up by the next one.

    Args:
        spec: The cluster to emulate.

    Example:

    ```python
    with EmulatedCluster(ClusterSpec.load("mixed")) as cluster:
        server = subprocess.Popen(cluster.command(["omnikeras", "ps", "--port", "50051"]))
        cluster.shape([50051])
    ```
    """

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.name = f"{_PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self._controllers = ["cpu", "freezer"] + (["cpuset"] if any(h.cpuset for h in spec.hosts) else [])
        self._ports: list[int] = []
        self._created = False

    # Life ---------------------------------------------------------------------------------

    def __enter__(self) -> "EmulatedCluster":
        missing = missing_requirements(self.spec)
        if missing:
            raise EmulationError("cannot emulate a cluster on this machine; missing: " + "; ".join(missing))
        remove_stale()
        try:
            _run("ip", "netns", "add", self.name)
            self._created = True
            _run("ip", "-n", self.name, "link", "set", "lo", "up")
            for host in self.spec.hosts:
                self._make_cgroups(host)
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.remove()

    def remove(self) -> None:
        """Thaws and kills what is left in the hosts' cgroups, then removes them and the
        namespace. Safe to call more than once."""
        _remove(self.name)
        self._created = False

    # Processes ----------------------------------------------------------------------------

    def command(self, argv: Sequence[str], host: HostSpec | None = None) -> list[str]:
        """`argv` run inside the namespace, and inside `host`'s cgroups when given."""
        return [*self.prefix(host), *argv]

    def prefix(self, host: HostSpec | None = None) -> list[str]:
        """What `command` puts before a command line."""
        procs = [str(self._cgroup(c, host) / "cgroup.procs") for c in self._controllers] if host else []
        # The shell enters the cgroups, then becomes the command: same process, same pid.
        enter = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 97; shift; n=$((n - 1)); done; exec "$@"'
        return ["sh", "-c", enter, "sh", str(len(procs)), *procs, "ip", "netns", "exec", self.name]

    # The link -----------------------------------------------------------------------------

    def shape(self, ports: Sequence[int]) -> None:
        """Limits the traffic to and from each server port to the spec's bandwidth, each
        direction on its own (an htb class per port and direction on the loopback)."""
        rate = f"{int(self.spec.link_bits_per_second)}bit"
        size = str(_LOOPBACK_MTU)
        self._tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1")
        self._tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate", "100gbit", "quantum", size)
        # Where cut traffic goes: a queue that holds no packet drops every one.
        self._tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:2", "htb", "rate", "100gbit", "quantum", size)
        self._tc("qdisc", "add", "dev", "lo", "parent", "1:2", "handle", "2:", "pfifo", "limit", "0")
        for index, port in enumerate(ports):
            for offset, direction in ((0, "dport"), (1, "sport")):
                classid = f"1:{16 + 2 * index + offset:x}"
                self._tc(
                    "class", "add", "dev", "lo", "parent", "1:", "classid", classid, "htb", "rate", rate, "ceil", rate,
                    "burst", size, "cburst", size, "quantum", size,
                )
                self._filter(100, direction, port, classid)
        self._ports = list(ports)

    def cut(self, shard: int) -> None:
        """Drops every packet to and from parameter server `shard` until `restore`."""
        for direction in ("dport", "sport"):
            self._filter(1 + shard, direction, self._port(shard), "1:2")

    def restore(self, shard: int) -> None:
        self._tc("filter", "del", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", str(1 + shard))

    # Hosts --------------------------------------------------------------------------------

    def pause(self, host: HostSpec) -> None:
        """Freezes every process of `host` until `resume`."""
        (self._cgroup("freezer", host) / "freezer.state").write_text("FROZEN")

    def resume(self, host: HostSpec) -> None:
        (self._cgroup("freezer", host) / "freezer.state").write_text("THAWED")

    # Internals ----------------------------------------------------------------------------

    def _make_cgroups(self, host: HostSpec) -> None:
        for controller in self._controllers:
            self._cgroup(controller, host).mkdir(parents=True)
        cpu = self._cgroup("cpu", host)
        if host.cpus is not None:
            (cpu / "cpu.cfs_period_us").write_text(str(_CFS_PERIOD_US))
            (cpu / "cpu.cfs_quota_us").write_text(str(max(1000, round(host.cpus * _CFS_PERIOD_US))))
        if "cpuset" in self._controllers:
            for directory in (self._cgroup("cpuset", None), self._cgroup("cpuset", host)):
                # A cpuset group takes tasks only once its cores and memory nodes are set.
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (directory / name).write_text((directory.parent / name).read_text())
            if host.cpuset:
                (self._cgroup("cpuset", host) / "cpuset.cpus").write_text(host.cpuset)

    def _cgroup(self, controller: str, host: HostSpec | None) -> pathlib.Path:
        run = CGROUP_ROOT / controller / self.name
        return run if host is None else run / host.name

    def _port(self, shard: int) -> int:
        if not 0 <= shard < len(self._ports):
            raise EmulationError(f"no parameter server {shard}: the link has {len(self._ports)}")
        return self._ports[shard]

    def _filter(self, priority: int, direction: str, port: int, classid: str) -> None:
        self._tc(
            "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", str(priority),
            "u32", "match", "ip", direction, str(port), "0xffff", "flowid", classid,
        )

    def _tc(self, *args: str) -> None:
        _run("ip", "netns", "exec", self.name, "tc", *args)


def remove_stale() -> None:
    """Removes the namespaces and cgroups of runs whose launcher is gone."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    names = {n for n in listed if n.startswith(_PREFIX)}
    for controller in ("cpu", "freezer", "cpuset"):
        directory = CGROUP_ROOT / controller
        if directory.is_dir():
            names |= {p.name for p in directory.glob(f"{_PREFIX}*") if p.is_dir()}
    for name in names:
        pid = name.removeprefix(_PREFIX).partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            _remove(name)


def _remove(name: str) -> None:
    # Frozen processes cannot die: thaw first.
    for state in (CGROUP_ROOT / "freezer" / name).glob("*/freezer.state"):
        state.write_text("THAWED")
    deadline = time.monotonic() + 10
    for controller in ("cpu", "freezer", "cpuset"):
        run = CGROUP_ROOT / controller / name
        if not run.is_dir():
            continue
        for host in [p for p in run.iterdir() if p.is_dir()]:
            while _kill_all(host / "cgroup.procs") and time.monotonic() < deadline:
                time.sleep(0.05)
            host.rmdir()
        run.rmdir()
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _kill_all(procs: pathlib.Path) -> bool:
    """SIGKILLs every process listed; True while any was left."""
    pids = [int(p) for p in procs.read_text().split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return bool(pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise EmulationError(f"`{' '.join(command)}` failed: {result.stderr.strip() or result.stdout.strip()}")
