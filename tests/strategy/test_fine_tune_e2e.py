"""A later `fit` that trains other variables than the first, through a launched cluster
of two workers in two groups and two server shards: keras-io's fine-tuning of a base
unfrozen after its head was trained."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = pathlib.Path(__file__).with_name("fine_tune_script.py")
pytestmark = pytest.mark.slow


def test_the_unfrozen_base_trains_on_every_worker_and_the_servers(tmp_path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--no-merge",
         "--workers", "2", "--groups", "2", "--ps-shards", "2", str(SCRIPT), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    chief, other = (json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in range(2))

    # The head trained on the chief's frozen base on both workers, not on each its own.
    np.testing.assert_array_equal(np.load(tmp_path / "frozen-1.npy"), np.load(tmp_path / "frozen-0.npy"))
    assert chief["base_trained"] and other["base_trained"]
    # The base's kernel, bias, gamma and beta, and the head's kernel and bias.
    assert chief["trainable"] == other["trainable"] == 6
    assert chief["servers_hold"], "the servers hold the fine-tuned model's variables, and no others"
    assert chief["servers_hold_them"]
    with np.load(tmp_path / "weights-0.npz") as chief_weights, np.load(tmp_path / "weights-1.npz") as other_weights:
        for name in chief_weights.files:
            np.testing.assert_array_equal(other_weights[name], chief_weights[name])
    # Fine-tuning goes on from where the head's training ended.
    assert other["tuned"] == chief["tuned"]
    assert chief["tuned"]["loss"][-1] < chief["head"]["loss"][0]
    assert chief["tuned"]["val_accuracy"][-1] > 0.8
