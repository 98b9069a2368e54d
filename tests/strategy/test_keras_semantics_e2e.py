"""Keras semantics kept through a launched cluster: a schedule, weight decay, a variable
without a gradient, batch normalization and a learning-rate callback give the weights
plain Keras gives; a schedule of the user's own follows the servers' iteration count
across groups."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = pathlib.Path(__file__).with_name("semantics_script.py")
OWN_SCHEDULE_SCRIPT = pathlib.Path(__file__).with_name("own_schedule_script.py")
pytestmark = pytest.mark.slow


def _train(tmp_path: pathlib.Path, case: str) -> dict[str, np.ndarray]:
    out = tmp_path / f"{case}.npz"
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--workers", "1", "--log-dir", str(tmp_path / "logs"),
         str(SCRIPT), "--case", case, "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    with np.load(out) as saved:
        return dict(saved)


def _pairs(saved: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    count = sum(key.startswith("ours_") for key in saved)
    return [(saved[f"ours_{i}"], saved[f"plain_{i}"]) for i in range(count)]


def test_schedule_weight_decay_constraints_accumulation_and_batch_normalization_end_where_plain_keras_ends(tmp_path) -> None:
    saved = _train(tmp_path, "schedule")
    # 200 steps, accumulated 2 by 2.
    assert saved["updates"] == 100
    for ours, plain in _pairs(saved):
        np.testing.assert_allclose(ours, plain, atol=1e-5)
    # The variable without a gradient neither moved nor decayed.
    np.testing.assert_array_equal(saved["idle"], np.ones(3, np.float32))
    # The output kernel's constraint binds, on the server as in plain Keras.
    assert np.linalg.norm(saved["output_kernel"], axis=0).max() == pytest.approx(0.5, rel=1e-5)


def test_learning_rate_scheduler_changes_the_server_s_rate(tmp_path) -> None:
    saved = _train(tmp_path, "callbacks")
    # Halved at epochs 20, 40, ..., 180: nine times.
    assert saved["learning_rate"] == pytest.approx(0.1 / 2**9)
    for ours, plain in _pairs(saved):
        np.testing.assert_allclose(ours, plain, atol=1e-5)


def _own_schedule(tmp_path: pathlib.Path, launch_option: str = "", script_option: str = "") -> dict[str, np.ndarray]:
    out = tmp_path / "own_schedule.npz"
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--workers", "2", "--groups", "2",
         *filter(None, [launch_option]), "--log-dir", str(tmp_path / "logs"),
         str(OWN_SCHEDULE_SCRIPT), "--out", str(out), *filter(None, [script_option])],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    with np.load(out) as saved:
        return dict(saved)


def test_a_schedule_of_the_user_s_own_follows_the_servers_count_across_groups(tmp_path) -> None:
    saved = _own_schedule(tmp_path, launch_option="--no-compensation")
    iterations, updates, rate = int(saved["iterations"]), int(saved["updates"]), float(saved["learning_rate"])
    # Three passes of 44 batches, one update each, shared by the two groups.
    assert updates == 3 * 44
    # The chief took half the steps, but its optimizer counts every group's updates, as the
    # schedule does: at most the other group's last few came after its own last.
    assert updates - 3 <= iterations <= updates
    # The last rate applied is the schedule's at (about) the servers' count, not at the
    # chief's own steps (about half of it).
    assert 1e-4 * (updates - 3) <= rate <= 1e-4 * (updates + 1)


def test_a_schedule_warming_up_from_zero_trains_compensated_groups(tmp_path) -> None:
    # Compensation's cap on the step starts from a share of the compiled one: 0 here.
    saved = _own_schedule(tmp_path, script_option="--warmup")
    assert saved["learning_rate"] > 0
    assert saved["losses"][-1] < 0.5 * saved["losses"][0]
