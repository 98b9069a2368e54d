"""The batch-merging CPU path computes the same updates as the group it replaces.

Real launches of tests/strategy/cluster_script.py: two workers in one group, each in its
own process (`--no-merge`, shares 1:3), against the default on this CPU host, one
process training the group's merged batch.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from cluster_results import result_of, saved_weights

from omnikeras.profiles import ClusterProfile, DeviceProfile

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "strategy" / "cluster_script.py"
pytestmark = pytest.mark.slow


def _launch(run_dir: pathlib.Path, *options: str) -> subprocess.CompletedProcess[str]:
    # A profile gives the thread settings, so that nothing is measured here.
    profile = run_dir / "profile.json"
    ClusterProfile("m:f", 1, (DeviceProfile("/CPU:0", "CPU", (64,), (1000.0,), 2, 1),), 0.001).save(profile)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_NUM_")}
    return subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(run_dir / "logs"), "--profile", str(profile),
         "--workers", "2", "--groups", "1", *options,
         str(SCRIPT), "--weights-out", str(run_dir / "weights.npz")],
        capture_output=True, text=True, timeout=600, env=env,
    )


def test_the_merged_process_makes_the_same_updates_as_the_two_members(tmp_path) -> None:
    (tmp_path / "members").mkdir()
    (tmp_path / "merged").mkdir()
    members = _launch(tmp_path / "members", "--no-merge", "--throughputs", "1,3")
    assert members.returncode == 0, members.stderr[-3000:]
    merged = _launch(tmp_path / "merged")
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert "the 2 workers of 1 group run as 1 process" in merged.stderr

    assert result_of((tmp_path / "members" / "logs" / "worker-1.log").read_text())["rows_per_step"] == 48
    assert not (tmp_path / "merged" / "logs" / "worker-1.log").exists()
    chief = result_of(merged.stdout)
    # One member with the whole batch of 64, for the same 8 group steps (256 examples, 2 epochs).
    assert chief["rows_per_step"] == 64
    assert chief["steps"] == chief["server_version"] == 8
    before = saved_weights(tmp_path / "members" / "weights.npz")
    after = saved_weights(tmp_path / "merged" / "weights.npz")
    assert any(np.abs(w).sum() > 0 for w in after)
    for ours, reference in zip(after, before):
        np.testing.assert_allclose(ours, reference, atol=1e-5)
