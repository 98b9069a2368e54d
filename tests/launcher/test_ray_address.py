"""Which Ray cluster the launcher joins, and how fast it says that none answers."""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from omnikeras.launcher import ray_address
from omnikeras.launcher.ray_address import ClusterAddress, cluster_to_join


@pytest.fixture
def no_cluster_named(tmp_path, monkeypatch):
    """Neither RAY_ADDRESS nor Ray's file names a cluster; returns where the file would be."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_address, "CURRENT_CLUSTER", tmp_path / "ray_current_cluster")
    return tmp_path / "ray_current_cluster"


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_cluster_to_join_is_the_one_asked_for_else_the_environment_s_else_the_last_started(
    no_cluster_named, monkeypatch
) -> None:
    assert cluster_to_join(None) is None
    assert cluster_to_join("local") is None
    no_cluster_named.write_text("127.0.0.1:41000\n")
    assert cluster_to_join(None) == ClusterAddress("127.0.0.1:41000", str(no_cluster_named))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cluster_to_join("auto") == ClusterAddress("10.0.0.1:6379", "RAY_ADDRESS")
    assert cluster_to_join("127.0.0.1:1") == ClusterAddress("127.0.0.1:1", "--ray-address")


@pytest.mark.parametrize(
    ("address", "target", "loopback"),
    [
        ("127.0.0.1:6379", ("127.0.0.1", 6379), True),
        ("localhost:6379", ("localhost", 6379), True),
        ("127.0.1.1:6379", ("127.0.1.1", 6379), True),
        ("[::1]:6379", ("::1", 6379), True),
        ("ray://127.0.0.1:10001", ("127.0.0.1", 10001), True),
        ("10.0.0.1:6379", ("10.0.0.1", 6379), False),
        ("head.example:6379", ("head.example", 6379), False),
        ("auto", None, False),
    ],
)
def test_an_address_names_a_host_and_port_on_loopback_or_not(address, target, loopback) -> None:
    cluster = ClusterAddress(address, "--ray-address")
    assert cluster.host_and_port == target
    assert cluster.on_loopback is loopback


def test_an_address_where_nothing_listens_is_refused_at_once_with_what_to_check() -> None:
    address = f"127.0.0.1:{_unused_port()}"
    start = time.monotonic()
    with pytest.raises(ConnectionError) as refused:
        ray_address.check_answers(ClusterAddress(address, "--ray-address"))
    assert time.monotonic() - start < 5
    message = str(refused.value)
    assert f"no Ray cluster answers at {address}: Connection refused" in message
    assert f"ray status --address {address}" in message and "ray start --head" in message


def test_an_address_where_something_listens_answers() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert ray_address.answers(ClusterAddress(f"127.0.0.1:{server.getsockname()[1]}", "--ray-address"))


def test_a_cluster_last_started_here_and_gone_is_replaced_by_a_new_one(no_cluster_named) -> None:
    no_cluster_named.write_text(f"127.0.0.1:{_unused_port()}")
    said: list[str] = []
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        pytest.skip("this process is connected to a Ray cluster: the launcher uses it")
    assert ray_address.resolve(None, said.append) is None
    assert said == [f"the Ray cluster last started on this machine ({no_cluster_named.read_text()}) does not answer: "
                    "starting one"]


def test_a_cluster_asked_for_that_does_not_answer_is_an_error(no_cluster_named) -> None:
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        pytest.skip("this process is connected to a Ray cluster: the launcher uses it")
    with pytest.raises(ConnectionError, match="no Ray cluster answers at 127.0.0.1:"):
        ray_address.resolve(f"127.0.0.1:{_unused_port()}", print)


def _shell_environment() -> dict[str, str]:
    """This environment as a user's shell has it: without the tests' loopback setting."""
    environment = dict(os.environ)
    environment.pop(ray_address.LOOPBACK_VARIABLE, None)
    environment.pop("RAY_ADDRESS", None)
    return environment


def test_from_a_shell_a_loopback_address_stays_on_loopback() -> None:
    pytest.importorskip("ray")
    # In a process of its own, as `omnikeras launch` from a shell: Ray must not turn the
    # loopback address into this machine's network address (faked here: nothing is sent).
    script = textwrap.dedent(
        """
        import socket, sys
        from omnikeras.launcher import ray_address
        with socket.create_server(("127.0.0.1", 0)) as server:
            address = f"127.0.0.1:{server.getsockname()[1]}"
            if sys.argv[1] == "launcher":
                assert ray_address.resolve(address, print) == address
            import ray._private.services as services
            services.node_ip_address_from_perspective = lambda address=None: "192.0.2.1"
            print(services.canonicalize_bootstrap_address(address).partition(":")[0])
        """
    )
    seen = {
        how: subprocess.run(
            [sys.executable, "-c", script, how], capture_output=True, text=True, timeout=120, env=_shell_environment()
        )
        for how in ("launcher", "plain ray")
    }
    assert seen["launcher"].returncode == 0, seen["launcher"].stderr[-2000:]
    assert seen["launcher"].stdout.split() == ["127.0.0.1"]
    # What the launcher did not do before: Ray alone seeks the cluster elsewhere.
    assert seen["plain ray"].stdout.split() == ["192.0.2.1"], seen["plain ray"].stderr[-2000:]


def test_omnikeras_launch_says_within_seconds_that_no_cluster_answers_at_the_address(tmp_path) -> None:
    (tmp_path / "train.py").write_text("")
    address = f"127.0.0.1:{_unused_port()}"
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--ray-address", address, "--log-dir", str(tmp_path / "logs"),
         "train.py"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_shell_environment(),
    )
    assert time.monotonic() - start < 15, run.stderr[-2000:]
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"omnikeras launch: no Ray cluster answers at {address}: Connection refused. Check that" in run.stderr
