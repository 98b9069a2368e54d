"""Regrouping and restoring while every worker trains, for many cycles, under load."""

import pathlib
import subprocess
import sys

import pytest
from cluster_results import result_of

SCRIPT = pathlib.Path(__file__).with_name("regroup_script.py")


@pytest.mark.slow
def test_many_regroups_and_restores_while_training(tmp_path) -> None:
    # Four worker processes on this machine's cores are the load.
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--no-merge",
         "--workers", "4", "--groups", "4", str(SCRIPT), "--cycles", "150"],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    chief = result_of(run.stdout)
    assert chief["changes"] == 150
    assert chief["groups_seen"] == [1, 2, 4]
    others = [result_of((tmp_path / "logs" / f"worker-{index}.log").read_text()) for index in (1, 2, 3)]
    # Every worker ends with the server's final weights.
    assert {other["weights_checksum"] for other in others} == {chief["weights_checksum"]}
    assert all(other["steps"] > 0 for other in others)
