"""OmnivoreCallback on launched clusters, with a real Optuna storage."""

import csv
import pathlib
import subprocess
import sys

import optuna
import pytest
from cluster_results import result_of

from omnikeras.tuner import records
from omnikeras.tuner.records import PhaseRecord, TrialRecord
from omnikeras.tuner.search import Config

SCRIPT = pathlib.Path(__file__).with_name("tune_script.py")
pytestmark = pytest.mark.slow


def _launch(tmp_path: pathlib.Path, run: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / run), *options],
        capture_output=True, text=True, timeout=600,
    )


def _study(storage: str) -> optuna.Study:
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def test_one_device_tunes_records_the_study_and_survives_diverging_trials(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path}/study.db"
    # A large tuning overhead: room for the whole cold start in a short run.
    run = _launch(
        tmp_path, "first", "--workers", "2", str(SCRIPT), "--storage", storage, "--diverging", "--overhead", "0.5",
        "--epochs", "30", "--budget", "10", "--csv", str(tmp_path / "log.csv"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # Two workers of one group on a CPU host run as one process: one device.
    assert "one worker process, one device: tuning momentum and learning rate only" in run.stdout
    assert "omnivore phase 0:" in run.stdout
    study = _study(storage)
    assert study.study_name.startswith("omnivore-") and "-b32-n1438-t0.05" in study.study_name
    trials = [(t, TrialRecord.read(t)) for t in study.trials]
    diverged = [t for t, record in trials if record and record.diverged]
    assert diverged and all(t.state == optuna.trial.TrialState.PRUNED for t in diverged)
    completed = [(t, record) for t, record in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert completed
    for trial, record in completed:
        assert record.time_to_target == pytest.approx(trial.value)
        assert record.probe_loss_end < record.probe_loss_start
        assert record.measured_seconds_per_update > 0
    assert min(t.value for t, _ in completed) == pytest.approx(study.best_value)
    chosen = PhaseRecord.read_all(study)[0]
    assert chosen.config.num_groups == 1 and chosen.tuning_seconds > 0
    assert chosen.config not in {records.config_of(t.params) for t in diverged}
    assert study.user_attrs[records.LOSS_CURVE]
    with open(tmp_path / "log.csv") as log:
        rows = list(csv.DictReader(log))
    assert float(rows[-1]["omnivore_learning_rate"]) == pytest.approx(chosen.config.learning_rate)


def test_the_tuner_regroups_while_fit_runs_and_training_goes_on(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path}/study.db"
    run = _launch(
        tmp_path, "regroup", "--workers", "2", "--groups", "2", "--no-merge", str(SCRIPT), "--storage", storage,
        "--epochs", "8", "--report",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    study = _study(storage)
    phase = PhaseRecord.read_all(study)[0]
    # Timed at 1 and at 2 groups: the layout changed twice while the workers trained.
    assert set(phase.seconds_per_update) == {1, 2}
    assert "seconds per update" in run.stdout
    cold_start_trials = [t for t in study.trials if t.user_attrs.get("phase") == 0]
    if "searching from 2 groups, compensated (momenta are totals)" in run.stdout:
        # Compensated (the default): the compiled settings at 2 groups, from the timing alone.
        assert phase.config == Config(2, pytest.approx(0.01), pytest.approx(0.9))
        assert not cold_start_trials and "from the timing alone" in run.stdout
    else:
        assert "searching from 1 group" in run.stdout
        assert cold_start_trials, "one group pays most: the prototype's cold start, which compensation leaves as it is"
    chief = result_of(run.stdout)
    other = result_of((tmp_path / "regroup" / "worker-1.log").read_text())
    assert chief["test_accuracy"] > 0.85
    assert chief["weights_checksum"] == other["weights_checksum"]
    assert chief["steps"] > 0 and other["steps"] > 0


def test_a_second_run_starts_from_the_first_run_s_choice(tmp_path) -> None:
    storage = str(tmp_path / "study.journal")
    first = _launch(tmp_path, "first", "--workers", "1", str(SCRIPT), "--storage", storage, "--epochs", "4")
    assert first.returncode == 0, first.stderr[-3000:]
    second = _launch(tmp_path, "second", "--workers", "1", str(SCRIPT), "--storage", storage, "--epochs", "2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "starting from what an earlier run of this study chose" in second.stdout
