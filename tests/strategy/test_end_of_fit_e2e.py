"""What `fit` leaves when it ends, through a launched cluster: the weights a callback
chose on the chief (`EarlyStopping(restore_best_weights=True)`), and on every worker the
chief's History, validation metrics included."""

import json
import math
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).with_name("end_of_fit_script.py")
pytestmark = pytest.mark.slow


def test_restored_best_weights_stay_on_the_chief_and_every_worker_returns_the_chief_s_history(tmp_path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--no-merge",
         "--workers", "2", "--groups", "2", str(SCRIPT), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    chief, other = (json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in range(2))

    assert chief["holds_best"], "the chief's model holds the weights EarlyStopping restored"
    assert not chief["holds_final"], "the best epoch's weights are not the server's last ones"
    best = chief["history"]["val_loss"][chief["best_epoch"]]
    assert math.isclose(chief["evaluated_loss"], best, rel_tol=1e-5)
    assert best == max(chief["history"]["val_loss"])

    # The other worker validated nothing itself: its fit returns the chief's History.
    assert other["epoch"] == chief["epoch"] == [0, 1, 2, 3]
    assert other["history"] == chief["history"]
    assert {"val_loss", "val_accuracy", "loss", "accuracy"} <= other["history"].keys()
