"""`omnikeras profile` end to end: real measuring processes and a real parameter server."""

import subprocess
import sys

import pytest

from omnikeras.profiles import ClusterProfile

TINY_MODEL = """
import keras

def build():
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                             keras.layers.Flatten(), keras.layers.Dense(10)])
"""


@pytest.mark.slow
def test_profile_measures_writes_json_and_prints_a_table(tmp_path) -> None:
    (tmp_path / "tiny.py").write_text(TINY_MODEL)
    out = tmp_path / "profile.json"
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "profile", "--model", f"{tmp_path / 'tiny.py'}:build",
         "--devices", "cpu", "--batch-sizes", "8,32", "--repeats", "2", "--seconds", "0.1", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    profile = ClusterProfile.load(out)
    cpu = profile.device("/CPU:0")
    assert cpu.batch_sizes == (8, 32)
    assert all(rate > 0 for rate in cpu.examples_per_second)
    # conv 3*3*1*4 + 4, dense 6*6*4*10 + 10
    assert profile.parameter_count == 40 + 1450
    assert 0 < profile.push_pull_seconds < 1
    # The thread settings were measured: every candidate has a progress line.
    assert cpu.intra_op_threads is not None and cpu.inter_op_threads is not None
    assert "threads 1/1 (intra/inter), median" in run.stderr
    assert "/CPU:0 batch 32, run 2/2" in run.stderr
    assert "/CPU:0" in run.stdout and "batch 32" in run.stdout


def test_bad_devices_are_refused() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "profile", "--devices", "tpu:0"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert "expected devices like cpu,gpu:0" in run.stderr
