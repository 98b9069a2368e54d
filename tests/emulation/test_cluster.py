"""The namespace, the shaped link and the cgroups of an emulated cluster, on the kernel."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest
from conftest import needs_emulation

from omnikeras.emulation import ClusterSpec, EmulatedCluster, EmulationError
from omnikeras.emulation import cluster as cluster_module

pytestmark = needs_emulation
SPEC = ClusterSpec.from_dict("test", {"link": "100mbit", "hosts": [{"name": "slow", "cpus": 0.25}, {"name": "free"}]})


def _namespaces() -> set[str]:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


def _cgroups(name: str) -> list[pathlib.Path]:
    return [p for p in (cluster_module.CGROUP_ROOT / c / name for c in ("cpu", "freezer")) if p.exists()]


def test_two_clusters_side_by_side_are_made_and_removed() -> None:
    with EmulatedCluster(SPEC) as first, EmulatedCluster(SPEC) as second:
        assert first.name != second.name
        assert {first.name, second.name} <= _namespaces()
        assert len(_cgroups(first.name)) == len(_cgroups(second.name)) == 2
    assert not {first.name, second.name} & _namespaces()
    assert _cgroups(first.name) == _cgroups(second.name) == []


def test_the_link_runs_at_the_spec_s_bandwidth_and_other_ports_do_not() -> None:
    with EmulatedCluster(SPEC) as cluster:
        cluster.shape([7001])
        probe = [sys.executable, "-m", "omnikeras.emulation.link_probe", "--megabytes", "5"]
        shaped = json.loads(subprocess.run(cluster.command([*probe, "--port", "7001"]), capture_output=True, text=True, timeout=60, check=True).stdout)
        free = json.loads(subprocess.run(cluster.command([*probe, "--port", "7002"]), capture_output=True, text=True, timeout=60, check=True).stdout)
    # 100 Mbit/s is 12.5 MB/s each way: asserted as an order of magnitude only.
    for rate in shaped.values():
        assert 4 < rate < 40, shaped
    assert min(free.values()) > 10 * max(shaped.values()), (shaped, free)


def test_a_cut_link_drops_every_packet_until_restored() -> None:
    script = (
        "import socket, sys\n"
        "server = socket.create_server(('127.0.0.1', 7003))\n"
        "client = socket.socket(); client.settimeout(1.5)\n"
        "try:\n    client.connect(('127.0.0.1', 7003)); print('connected')\n"
        "except OSError: print('no connection')\n"
    )
    with EmulatedCluster(SPEC) as cluster:
        cluster.shape([7003])
        cluster.cut(0)
        during = subprocess.run(cluster.command([sys.executable, "-c", script]), capture_output=True, text=True, timeout=30)
        cluster.restore(0)
        after = subprocess.run(cluster.command([sys.executable, "-c", script]), capture_output=True, text=True, timeout=30)
    assert during.stdout.strip() == "no connection"
    assert after.stdout.strip() == "connected"


def test_a_host_gets_its_share_of_a_core_and_can_be_paused() -> None:
    spin = "import time\nend = time.monotonic() + 2\nwhile time.monotonic() < end: pass\nprint(time.process_time())"
    with EmulatedCluster(SPEC) as cluster:
        slow, free = SPEC.hosts
        capped = subprocess.Popen(cluster.command([sys.executable, "-c", spin], slow), stdout=subprocess.PIPE, text=True)
        uncapped = subprocess.Popen(cluster.command([sys.executable, "-c", spin], free), stdout=subprocess.PIPE, text=True)
        capped_cpu, uncapped_cpu = float(capped.communicate(timeout=30)[0]), float(uncapped.communicate(timeout=30)[0])
        # A quarter of a core for two seconds is half a second of CPU: an order of magnitude.
        assert 0.1 < capped_cpu < 1.0
        assert uncapped_cpu > 1.5 * capped_cpu

        counter = subprocess.Popen(
            cluster.command([sys.executable, "-u", "-c", "import time\nwhile True:\n    print(time.monotonic(), flush=True); time.sleep(0.05)"], free),
            stdout=subprocess.PIPE, text=True,
        )
        assert counter.stdout is not None
        stamps = [float(counter.stdout.readline())]
        cluster.pause(free)
        time.sleep(1.0)
        cluster.resume(free)
        stamps += [float(counter.stdout.readline()) for _ in range(10)]
        counter.kill()
        counter.wait()
    assert max(b - a for a, b in zip(stamps, stamps[1:])) > 0.8


def test_leaving_kills_what_is_left_in_the_hosts() -> None:
    with EmulatedCluster(SPEC) as cluster:
        orphan = subprocess.Popen(cluster.command(["sleep", "300"], SPEC.hosts[0]))
        time.sleep(0.3)
        cluster.pause(SPEC.hosts[0])
    # Frozen when the cluster went: thawed, killed, and its cgroups removed.
    assert orphan.wait(timeout=30) == -9
    assert _cgroups(cluster.name) == []


def test_a_dead_launcher_s_cluster_is_removed_by_the_next() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = EmulatedCluster(SPEC)
    stale.name = f"omnikeras-{dead.pid}-0000"
    stale.__enter__()
    assert stale.name in _namespaces()
    with EmulatedCluster(SPEC):
        assert stale.name not in _namespaces()
        assert _cgroups(stale.name) == []


def test_what_is_missing_is_named_before_anything_starts(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(cluster_module.shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/ip")
    monkeypatch.setattr(cluster_module, "CGROUP_ROOT", pathlib.Path("/nonexistent"))
    before = _namespaces()
    with pytest.raises(EmulationError) as raised:
        EmulatedCluster(SPEC).__enter__()
    message = str(raised.value)
    assert "root" in message and "`tc` command" in message and "cgroup v1 cpu controller" in message
    assert "cgroup v1 freezer controller" in message
    assert _namespaces() == before


def test_probing_an_address_in_the_namespace_reaches_nothing_outside() -> None:
    # The namespace has its own loopback: a port listening outside it is not reachable.
    outside = socket.create_server(("127.0.0.1", 0))
    port = outside.getsockname()[1]
    try:
        with EmulatedCluster(SPEC) as cluster:
            script = f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('reached')\nexcept OSError: print('refused')"
            result = subprocess.run(cluster.command([sys.executable, "-c", script]), capture_output=True, text=True, timeout=30)
        assert result.stdout.strip() == "refused"
    finally:
        outside.close()


def test_a_host_on_a_cpuset_runs_on_those_cores_only() -> None:
    pinned = ClusterSpec.from_dict("pinned", {"link": "1gbit", "hosts": [{"name": "zero", "cpuset": "0"}]})
    read = "print(open('/proc/self/status').read().split('Cpus_allowed_list:')[1].split()[0])"
    with EmulatedCluster(pinned) as cluster:
        result = subprocess.run(cluster.command([sys.executable, "-c", read], pinned.hosts[0]), capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "0", result.stderr
