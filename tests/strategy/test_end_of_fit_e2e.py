"""What `fit` leaves when it ends, through a launched cluster: on every worker, the
weights a callback chose on the chief (`EarlyStopping(restore_best_weights=True)`) and
the chief's History, validation metrics included."""

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = pathlib.Path(__file__).with_name("end_of_fit_script.py")
pytestmark = pytest.mark.slow


def _launch(tmp_path: pathlib.Path, *script_args: str, timeout: float = 600) -> tuple[dict, dict]:
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--no-merge",
         "--workers", "2", "--groups", "2", str(SCRIPT), "--out", str(tmp_path), *script_args],
        capture_output=True, text=True, timeout=timeout,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    chief, other = (json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in range(2))
    return chief, other


def test_every_worker_ends_with_the_weights_and_the_history_of_the_chief(tmp_path) -> None:
    chief, other = _launch(tmp_path)

    assert chief["holds_best"], "the chief's model holds the weights EarlyStopping restored"
    assert chief["server_holds_them"], "the chief put them on the server"
    best = chief["history"]["val_loss"][chief["best_epoch"]]
    assert math.isclose(chief["evaluated_loss"], best, rel_tol=1e-5)
    # The best epoch is the first (mode="max"), not the one training ended with.
    assert chief["best_epoch"] == 0 and best > min(chief["history"]["val_loss"])
    with np.load(tmp_path / "weights-0.npz") as chief_weights, np.load(tmp_path / "weights-1.npz") as other_weights:
        assert chief_weights.files == other_weights.files
        for name in chief_weights.files:
            np.testing.assert_array_equal(other_weights[name], chief_weights[name])

    # The other worker validated nothing itself: its fit returns the chief's History.
    assert other["epoch"] == chief["epoch"] == [0, 1, 2, 3]
    assert other["history"] == chief["history"]
    assert {"val_loss", "val_accuracy", "loss", "accuracy"} <= other["history"].keys()


def test_a_worker_that_ended_first_sees_its_training_end_though_the_next_fit_began(tmp_path) -> None:
    # The other worker ends its first fit on its own while the chief's is held up; the
    # chief then leaves and at once joins its second fit. The other must take the first
    # training's end from the servers' count, not from a moment without workers that the
    # chief's second fit leaves no room for (it waited for the finish timeout, 300 s).
    chief, other = _launch(tmp_path, "--again", timeout=240)
    assert chief["epoch"] == other["epoch"] == [0, 1]
    assert other["history"] == chief["history"]
