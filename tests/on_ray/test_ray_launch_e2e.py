"""`omnikeras launch --ray-address` on a real local Ray cluster of two nodes (see
conftest.py): training, workers sharing a node, a worker's and a server's actor killed
mid-run, and Ctrl-C. The launcher runs as from a user's shell: without the tests' setting
that puts Ray on loopback, which the cluster has and the launcher must find by itself."""

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import ray
from certificates import self_signed
from cluster_results import result_of

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "strategy" / "cluster_script.py"
pytestmark = pytest.mark.slow


def _command(run_dir: pathlib.Path, address: str | None, *options: str, script_args: tuple[str, ...] = ()) -> list[str]:
    where = ["--ray-address", address] if address else ["--workers", "2"]
    return [sys.executable, "-m", "omnikeras", "launch", *where, "--log-dir", str(run_dir), *options,
            str(SCRIPT), *script_args]


def _shell_environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    return environment


def _run(run_dir: pathlib.Path, address: str | None, *options: str, script_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(run_dir, address, *options, script_args=script_args),
                          capture_output=True, text=True, timeout=600, env=_shell_environment())


def _actors_of(run_dir: pathlib.Path) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(run_dir.name + ":")]


def _wait_for_stall(run_dir: pathlib.Path, launcher: subprocess.Popen) -> None:
    log = run_dir / "worker-1.log"
    deadline = time.monotonic() + 180
    while not (log.exists() and "worker 1 stalls" in log.read_text()):
        assert launcher.poll() is None and time.monotonic() < deadline, "worker 1 never stalled"
        time.sleep(0.2)


def _stalled_run(run_dir: pathlib.Path, address: str, *options: str) -> subprocess.Popen:
    """A run of 1 group whose worker 1 stalls for 20 s after its second step, with epochs
    enough that the chief still trains when a restarted worker is back."""
    launcher = subprocess.Popen(
        _command(run_dir, address, "--groups", "1", "--checkpoint-every", "0.5", *options,
                 script_args=("--epochs", "24", "--stall-after", "2", "--stall-seconds", "20")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_shell_environment(),
    )
    _wait_for_stall(run_dir, launcher)
    return launcher


def test_two_nodes_train_the_digits_model_as_the_local_launcher_does(ray_cluster, tmp_path) -> None:
    # 96 updates in all: the compiled rule as it is, not the warm-up of compensated
    # asynchrony's step, which a run this short notices (the choice travels to Ray too).
    # With half as many, two runs of the same launch read 0.91 to 0.96 on the test set.
    script_args = ("--epochs", "12", "--examples", "512")
    on_ray = _run(tmp_path / "ray", ray_cluster, "--groups", "2", "--no-compensation", script_args=script_args)
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    local = _run(tmp_path / "local", None, "--groups", "2", "--no-compensation", script_args=script_args)
    assert local.returncode == 0, local.stderr[-3000:]

    assert "Ray cluster of 2 nodes: 1 parameter server, 2 workers (2 with 1 CPU) in 2 groups" in on_ray.stderr
    chief = result_of(on_ray.stdout)
    # The chief's output reached this console; the other worker's went to its log.
    assert "Epoch 12/12" in on_ray.stdout
    assert result_of((tmp_path / "ray" / "worker-1.log").read_text())["steps"] > 0
    accuracy, local_accuracy = chief["test_accuracy"], result_of(local.stdout)["test_accuracy"]
    assert accuracy > 0.85 and abs(accuracy - local_accuracy) <= 0.05, (accuracy, local_accuracy)
    assert _actors_of(tmp_path / "ray") == []


def test_two_groups_share_the_one_cpu_a_server_leaves_on_a_node_of_two(ray_cluster, tmp_path) -> None:
    # The head has 2 CPUs, as the machine `--ray --workers 2 --groups 2` was refused on:
    # one server holds 1, the two workers share the other (the second server is on the
    # other node, which it fills).
    run = _run(tmp_path / "run", ray_cluster, "--ps-shards", "2", "--workers", "2", "--groups", "2",
               script_args=("--epochs", "2", "--examples", "256"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2 parameter servers, 2 workers (2 with 0.5 CPUs) in 2 groups" in run.stderr
    assert result_of(run.stdout)["steps"] > 0
    assert result_of((tmp_path / "run" / "worker-1.log").read_text())["steps"] > 0
    assert _actors_of(tmp_path / "run") == []


def test_ray_on_this_machine_runs_two_groups_as_the_local_launcher_does(tmp_path) -> None:
    # `omnikeras launch --ray --workers 2 --groups 2` on a cluster of this machine alone,
    # new (RAY_ADDRESS=local, as the suite's cluster may be running): whatever its CPUs,
    # the server and the two workers share them.
    command = [sys.executable, "-m", "omnikeras", "launch", "--ray", "--workers", "2", "--groups", "2",
               "--log-dir", str(tmp_path), str(SCRIPT)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600,
                         env=dict(_shell_environment(), RAY_ADDRESS="local"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Ray cluster of 1 node: 1 parameter server, 2 workers (2 with " in run.stderr
    assert result_of(run.stdout)["steps"] > 0


def test_with_a_certificate_the_servers_serve_tls_to_workers_on_every_node(ray_cluster, tmp_path) -> None:
    cert, key = self_signed(tmp_path)
    handed_before = set(pathlib.Path(tempfile.gettempdir()).glob("omnikeras-tls-*"))
    run = _run(tmp_path / "run", ray_cluster, "--tls-cert", cert, "--tls-key", key, script_args=("--epochs", "2"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "with TLS" in (tmp_path / "run" / "ps-0.log").read_text()
    assert result_of(run.stdout)["steps"] > 0
    # The copies of the key and certificates handed to the actors went with them.
    assert set(pathlib.Path(tempfile.gettempdir()).glob("omnikeras-tls-*")) == handed_before


def test_a_killed_worker_actor_is_restarted_by_ray_and_rejoins_its_group(ray_cluster, tmp_path) -> None:
    launcher = _stalled_run(tmp_path, ray_cluster, "--group-timeout", "5")
    ray.kill(ray.get_actor(f"{tmp_path.name}:worker-1"), no_restart=False)
    stdout, stderr = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, stderr[-3000:]
    assert "the Ray actor of worker 1 is unavailable: Ray restarts it" in stderr
    # Only the restarted worker lived to print its result: it trained in its group again.
    worker_log = (tmp_path / "worker-1.log").read_text()
    assert worker_log.count("RESULT ") == 1 and "registered again" in worker_log
    assert result_of(worker_log)["steps"] > 0
    assert result_of(stdout)["test_accuracy"] > 0.85
    assert _actors_of(tmp_path) == []


def test_a_killed_server_actor_restarts_on_its_checkpoint_and_applies_no_update_twice(ray_cluster, tmp_path) -> None:
    launcher = _stalled_run(tmp_path, ray_cluster)
    # The group waits for worker 1; the servers' checkpoint, every 0.5 s, has every update.
    time.sleep(1.5)
    ray.kill(ray.get_actor(f"{tmp_path.name}:ps-0"), no_restart=False)
    stdout, stderr = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, stderr[-3000:]
    assert "the Ray actor of parameter server 0 is unavailable: Ray restarts it" in stderr
    server_log = (tmp_path / "ps-0.log").read_text()
    assert server_log.count("resumed from") >= 1, server_log[-2000:]
    chief = result_of(stdout)
    # Every update is a step of the chief's group, so one applied twice would put the
    # version above the chief's steps; the checkpoint holds all but the step under way.
    assert chief["steps"] - 1 <= chief["server_version"] <= chief["steps"]
    assert chief["steps"] >= 24
    assert _actors_of(tmp_path) == []


def test_ctrl_c_stops_every_actor_and_process(ray_cluster, tmp_path) -> None:
    launcher = _stalled_run(tmp_path, ray_cluster)
    launcher.send_signal(signal.SIGINT)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, stderr[-3000:]
    assert "interrupted" in stderr
    assert _actors_of(tmp_path) == []
    # Neither the server (its checkpoints are under tmp_path) nor a worker lives on.
    for pattern in (str(tmp_path), str(SCRIPT)):
        assert subprocess.run(["pgrep", "-f", pattern], capture_output=True).stdout == b""
