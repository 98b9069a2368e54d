"""`omnikeras launch` with real parameter-server and worker processes."""

import pathlib
import signal
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


def test_a_killed_worker_is_reported_and_the_others_finish(tmp_path) -> None:
    run = _launch(
        tmp_path, "--workers", "2", "--groups", "1", "--group-timeout", "3",
        script_args=("--examples", "512", "--epochs", "2", "--die-after", "2"),
    )
    assert run.returncode == 1
    assert "worker 1 was killed by signal 9" in run.stderr
    chief = result_of(run.stdout)
    # The chief's group went on without the dead member and finished every step.
    assert chief["steps"] == 16
    assert chief["server_version"] == 16


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
