"""Mixed precision on a launched cluster: where one member's loss-scaled gradients
overflow, its whole group step is skipped, as Keras skips a step when the gradients its
replicas combine overflow, and every member lowers its loss scale alike."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from cluster_results import result_of

SCRIPT = pathlib.Path(__file__).with_name("loss_scale_script.py")
GROUP_TIMEOUT = 20
pytestmark = pytest.mark.slow


def test_an_overflow_skips_the_group_step_and_every_member_lowers_its_loss_scale(tmp_path) -> None:
    # A 4x faster member takes 4x the rows of each batch: the other member's gradients,
    # the mean over fewer rows, overflow at scales where the faster one's do not.
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--no-merge",
         "--workers", "2", "--groups", "1", "--throughputs", "1,4", "--group-timeout", str(GROUP_TIMEOUT),
         str(SCRIPT), "--initial-scale", str(2.0**24)],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    chief = result_of(run.stdout)
    other = result_of((tmp_path / "logs" / "worker-1.log").read_text())
    # One step per batch, skipped or not: 256 examples in batches of 32.
    assert chief["steps"] == other["steps"] == len(chief["scales"]) == 8
    # After a skipped step the scale halves, after an update it stays (it would grow after
    # 1,000): the same on both members, as Keras' rule sets it from the combined gradients.
    assert chief["scales"] == other["scales"]
    before = [2.0**24, *chief["scales"][:-1]]
    skipped = sum(after == scale / 2 for scale, after in zip(before, chief["scales"]))
    assert all(after in (scale, scale / 2) for scale, after in zip(before, chief["scales"]))
    assert 0 < skipped < 8
    assert chief["server_version"] == chief["iterations"] == other["iterations"] == 8 - skipped
    # Nobody waited for a missing member, nor was dropped.
    assert chief["workers_dropped"] == 0 and chief["seconds"] < GROUP_TIMEOUT
    for ours, theirs in zip(chief["weights"], other["weights"], strict=True):
        np.testing.assert_array_equal(np.array(ours), np.array(theirs))
