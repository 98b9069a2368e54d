"""`omnikeras launch` with real parameter-server and worker processes."""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from cluster_results import result_of, saved_weights

SCRIPT = pathlib.Path(__file__).with_name("cluster_script.py")
pytestmark = pytest.mark.slow


def _launch(tmp_path: pathlib.Path, *options: str, script_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    # --no-merge: these tests are about the members of a group, each in its own process.
    return subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--no-merge", *options,
         str(SCRIPT), *script_args],
        capture_output=True, text=True, timeout=600,
    )


@pytest.fixture(scope="module")
def plain_keras_weights(tmp_path_factory) -> list[np.ndarray]:
    """The same model trained by plain Keras in one process on the merged batches."""
    out = tmp_path_factory.mktemp("plain") / "weights.npz"
    subprocess.run([sys.executable, str(SCRIPT), "--plain", "--weights-out", str(out)], check=True, capture_output=True, timeout=600)
    return saved_weights(out)


@pytest.mark.parametrize("throughputs", [None, "1,3"])
def test_one_group_matches_synchronous_sgd_on_the_merged_batch(tmp_path, plain_keras_weights, throughputs) -> None:
    options = ["--workers", "2", "--groups", "1"] + (["--throughputs", throughputs] if throughputs else [])
    run = _launch(tmp_path, *options, script_args=("--weights-out", str(tmp_path / "w.npz")))
    assert run.returncode == 0, run.stderr[-3000:]
    chief = result_of(run.stdout)
    other = result_of((tmp_path / "logs" / "worker-1.log").read_text())
    # A 3x faster worker takes 3x the rows of each 64-example batch.
    assert (chief["rows_per_step"], other["rows_per_step"]) == ((32, 32) if throughputs is None else (16, 48))
    # 256 examples / 64 per batch, 2 epochs, every step applied once for the whole group.
    assert chief["steps"] == other["steps"] == chief["server_version"] == 8
    for ours, reference in zip(saved_weights(tmp_path / "w.npz"), plain_keras_weights):
        np.testing.assert_allclose(ours, reference, atol=1e-5)
    assert other["weights_checksum"] == chief["weights_checksum"]


def test_batch_normalization_statistics_are_combined_across_the_workers(tmp_path) -> None:
    run = _launch(tmp_path, "--workers", "2", "--groups", "1", script_args=("--batch-norm", "--shuffle"))
    assert run.returncode == 0, run.stderr[-3000:]
    chief = result_of(run.stdout)
    other = result_of((tmp_path / "logs" / "worker-1.log").read_text())
    mean, variance = (np.array(s) for s in chief["statistics"])
    # Both hold the server's statistics, which the training moved from their start.
    assert chief["statistics"] == other["statistics"]
    assert np.abs(mean).max() > 1e-3 and np.abs(variance - 1).max() > 1e-3


def test_fully_asynchronous_training_learns_and_runs_keras_callbacks(tmp_path) -> None:
    callbacks_dir = tmp_path / "callbacks"
    callbacks_dir.mkdir()
    run = _launch(
        tmp_path, "--workers", "3", "--groups", "3",
        script_args=("--examples", "1438", "--batch-size", "16", "--epochs", "3", "--shuffle",
                     "--learning-rate", "0.05", "--momentum", "0.3", "--callbacks-dir", str(callbacks_dir)),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    chief = result_of(run.stdout)
    assert chief["test_accuracy"] > 0.6, chief
    assert len(chief["history"]["val_accuracy"]) == 3
    # Three groups racing: updates were computed on weights others had moved since.
    assert any(int(lag) > 0 for group in chief["staleness"].values() for lag in group)
    assert (callbacks_dir / "model.keras").exists()
    assert len((callbacks_dir / "log.csv").read_text().splitlines()) == 4
    assert list((callbacks_dir / "tensorboard").rglob("events.out.tfevents.*"))
    for index in (1, 2):
        other = result_of((tmp_path / "logs" / f"worker-{index}.log").read_text())
        assert other["weights_checksum"] == chief["weights_checksum"]


def test_a_killed_worker_is_restarted_and_joins_its_group_again(tmp_path) -> None:
    run = _launch(
        tmp_path, "--workers", "2", "--groups", "1", "--group-timeout", "3",
        script_args=("--examples", "1438", "--batch-size", "16", "--epochs", "20", "--die-after", "2",
                     "--died-marker", str(tmp_path / "died")),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"worker 1 was killed by signal 9 .*: restarting it", run.stderr)
    chief = result_of(run.stdout)
    # The chief's group went on without its dead member, then with it again: 89 batches
    # of 16 in each of 20 epochs.
    assert chief["steps"] == 20 * 89
    restarted = result_of((tmp_path / "logs" / "worker-1.log").read_text())
    assert restarted["steps"] > 0
    assert restarted["weights_checksum"] == chief["weights_checksum"]
    assert chief["history"]["loss"][-1] < chief["history"]["loss"][0]


def test_a_stalled_worker_holds_its_group_no_longer_than_the_deadline_and_is_welcomed_back(tmp_path) -> None:
    run = _launch(
        tmp_path, "--workers", "2", "--groups", "1", "--group-timeout", "2",
        script_args=("--examples", "1438", "--batch-size", "16", "--epochs", "20", "--stall-after", "3",
                     "--stall-seconds", "6"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    chief, other = result_of(run.stdout), result_of((tmp_path / "logs" / "worker-1.log").read_text())
    log = (tmp_path / "logs" / "worker-1.log").read_text()
    assert "dropped from its group" in log and "registered again" in log
    assert chief["steps"] == 20 * 89 and other["steps"] > 3
    # After it came back, its pushes joined the chief's group steps again: the two
    # gradients of a step were combined as one update, so there are fewer updates than
    # the two workers' steps together.
    assert chief["server_version"] < chief["steps"] + other["steps"]
    assert other["weights_checksum"] == chief["weights_checksum"]


def test_a_killed_parameter_server_restarts_on_its_checkpoint_and_training_finishes(tmp_path) -> None:
    # Adam: its moments live on the server and come back from the checkpoint with it.
    launcher = subprocess.Popen(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--workers", "2",
         "--groups", "2", "--no-merge", "--checkpoint-every", "1", str(SCRIPT), "--examples", "1438",
         "--batch-size", "16", "--epochs", "30", "--optimizer", "adam", "--learning-rate", "0.003"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    checkpoints = tmp_path / "logs" / "ps-0-checkpoints"
    deadline = time.monotonic() + 180
    # A checkpoint past the first: training is under way.
    while len(list(checkpoints.glob("checkpoint-*.npz"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    server = subprocess.run(["pgrep", "-f", f"omnikeras ps .*{checkpoints}"], capture_output=True, text=True).stdout.split()
    assert len(server) == 1, server
    os.kill(int(server[0]), signal.SIGKILL)
    stdout, stderr = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, stderr[-3000:]
    assert re.search(r"parameter server 0 was killed by signal 9 .*: restarting it on its checkpoints", stderr)
    chief = result_of(stdout)
    assert len(chief["history"]["loss"]) == 30, "every epoch ran"
    logs = "".join((tmp_path / "logs" / f"worker-{i}.log").read_text(errors="replace") for i in (0, 1))
    assert "registered again" in logs
    # Each worker says what the restart lost: the updates it saw past the checkpoint.
    lost = re.findall(r"checkpoint at version (\d+): the (\d+) updates this worker saw after it \(up to version (\d+)\)", logs)
    assert len(lost) == 2
    # A worker whose last step came before the checkpoint lost none of its own.
    assert all(int(count) == max(int(seen) - int(checkpoint), 0) for checkpoint, count, seen in lost)
    assert chief["test_accuracy"] > 0.8
    with np.load(sorted(checkpoints.glob("checkpoint-*.npz"))[-1]) as checkpoint:
        header = json.loads(str(checkpoint["header"]))
        second_moments = [key for key in checkpoint.files if key.endswith(".velocity")]
    assert header["hyperparameters"]["optimizer"] == "Adam" and second_moments


def test_interrupting_the_launcher_leaves_no_process_behind(tmp_path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--no-merge",
         "--workers", "2", str(SCRIPT), "--examples", "1438", "--batch-size", "8", "--epochs", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "logs" / "worker-1.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)
    launcher.send_signal(signal.SIGINT)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 130
    assert "interrupted" in stderr
    survivors = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    assert survivors == ""


def test_processes_started_with_tf_config_train_as_a_launched_cluster(tmp_path, plain_keras_weights) -> None:
    # As a TFJob or a Slurm script starts them: the same TF_CONFIG for all, each its task.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": [f"127.0.0.1:{port}"]}

    def environment(task_type: str) -> dict[str, str]:
        tf_config = json.dumps({"cluster": cluster, "task": {"type": task_type, "index": 0}})
        return {k: v for k, v in os.environ.items() if k != "OMNIKERAS_CONFIG"} | {"TF_CONFIG": tf_config}

    server = subprocess.Popen(
        [sys.executable, "-m", "omnikeras", "ps", "--host", "127.0.0.1"],
        env=environment("ps"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip().endswith(f"127.0.0.1:{port}")
        workers = [
            subprocess.Popen(
                [sys.executable, str(SCRIPT), *(("--weights-out", str(tmp_path / "w.npz")) if role == "chief" else ())],
                env=environment(role), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for role in ("chief", "worker")
        ]
        outputs = [worker.communicate(timeout=600) for worker in workers]
    finally:
        server.terminate()
        server.wait(timeout=30)
    for worker, (_, stderr) in zip(workers, outputs):
        assert worker.returncode == 0, stderr[-3000:]
    chief, other = (result_of(stdout) for stdout, _ in outputs)
    assert (chief["worker_index"], other["worker_index"]) == (0, 1)
    assert chief["steps"] == other["steps"] == chief["server_version"] == 8
    for ours, reference in zip(saved_weights(tmp_path / "w.npz"), plain_keras_weights):
        np.testing.assert_allclose(ours, reference, atol=1e-5)
