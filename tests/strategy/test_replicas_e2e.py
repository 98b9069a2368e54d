"""A worker with several local replicas (devices) trains as Keras' `MirroredStrategy`
trains over the same devices: each replica takes its rows of every batch, and each epoch
is one pass over the data."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = pathlib.Path(__file__).with_name("replicas_script.py")
pytestmark = pytest.mark.slow


def _run(out: pathlib.Path, *flags: str) -> tuple[dict, list[np.ndarray]]:
    out.mkdir()
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *flags], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    with np.load(out / "weights.npz") as weights:
        return json.loads((out / "result.json").read_text()), [weights[name] for name in weights.files]


def test_two_replicas_train_as_mirrored_strategy_does(tmp_path) -> None:
    plain, plain_weights = _run(tmp_path / "plain", "--plain")
    launched, weights = _run(tmp_path / "strategy")
    assert launched["replicas"] == plain["replicas"] == 2
    assert launched["steps_per_epoch"] == plain["steps_per_epoch"] == [6, 6, 6]
    for expected, got in zip(plain_weights, weights, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
