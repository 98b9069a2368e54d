"""Compensated asynchrony through launched servers and workers: a functional model compiled
with a momentum and learning rate at the edge of what synchronous training takes."""

import pathlib
import subprocess
import sys

import pytest
from cluster_results import result_of

SCRIPT = pathlib.Path(__file__).with_name("compensation_script.py")
pytestmark = pytest.mark.slow


def _train(tmp_path: pathlib.Path, *options: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), *options, str(SCRIPT),
         "--epochs", "12"],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return result_of(run.stdout)


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory) -> dict:
    return _train(tmp_path_factory.mktemp("one"), "--workers", "1")


@pytest.mark.parametrize("groups", [2, 4])
def test_compensation_keeps_training_that_the_compiled_momentum_throws_off(tmp_path, one_worker, groups) -> None:
    layout = ("--workers", str(groups), "--groups", str(groups))
    compensated = _train(tmp_path / "on", *layout)
    as_compiled = _train(tmp_path / "off", *layout, "--no-compensation")
    assert one_worker["test_accuracy"] > 0.95
    # SGD(0.05, momentum 0.9) with the groups' own momentum on top: it diverges.
    assert as_compiled["test_accuracy"] < 0.2
    assert as_compiled["logs"]["explicit_momentum"] == pytest.approx(0.9)
    assert compensated["test_accuracy"] > 0.5
    logs = compensated["logs"]
    assert logs["implicit_momentum"] == pytest.approx(1 - 1 / groups, abs=0.15)
    # The explicit momentum gives up what the staleness adds; the step is capped below
    # the compiled 0.05 / (1 - 0.9) while the loss shows it is not stable there.
    assert logs["explicit_momentum"] < 0.9
    assert logs["learning_rate_in_force"] / (1 - logs["explicit_momentum"]) < 0.5
    assert logs["step_share"] == pytest.approx(logs["learning_rate_in_force"] / (1 - logs["explicit_momentum"]) / 0.5)
    assert as_compiled["logs"]["step_share"] == 1.0
    assert logs["loss"] < compensated["history"]["loss"][0]
