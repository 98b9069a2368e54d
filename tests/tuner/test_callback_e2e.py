"""OmnivoreCallback on launched clusters, with a real Optuna storage."""

import csv
import math
import pathlib
import subprocess
import sys

import optuna
import pytest

SCRIPT = pathlib.Path(__file__).with_name("tune_script.py")
pytestmark = pytest.mark.slow


def _launch(tmp_path: pathlib.Path, run: str, *script_args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--workers", "2", "--log-dir", str(tmp_path / run),
         str(SCRIPT), *script_args],
        capture_output=True, text=True, timeout=600,
    )


def _trials(storage: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="omnivore", storage=storage).trials


def test_tunes_records_the_study_and_survives_diverging_trials(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path}/study.db"
    run = _launch(tmp_path, "first", "--storage", storage, "--diverging", "--csv", str(tmp_path / "log.csv"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "omnivore phase 0:" in run.stdout
    trials = _trials(storage)
    diverged = [t for t in trials if t.user_attrs.get("diverged")]
    assert diverged and all(t.state == optuna.trial.TrialState.PRUNED for t in diverged)
    completed = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert completed
    for trial in completed:
        assert math.isfinite(trial.value)
        assert trial.user_attrs["measured_seconds_per_update"] > 0
        assert trial.user_attrs["predicted_seconds_per_update"] > 0
    study = optuna.load_study(study_name="omnivore", storage=storage)
    chosen = study.user_attrs["phase_0"]
    assert chosen["num_groups"] in (1, 2) and chosen["tuning_seconds"] > 0
    assert study.user_attrs["loss_curve"]
    with open(tmp_path / "log.csv") as log:
        rows = list(csv.DictReader(log))
    assert float(rows[-1]["omnivore_learning_rate"]) == pytest.approx(chosen["learning_rate"])
    assert "omnivore_measured_spu" in rows[-1] and "omnivore_staleness" in rows[-1]


def test_a_second_run_resumes_the_study_without_repeating_trials(tmp_path) -> None:
    storage = str(tmp_path / "study.journal")
    first = _launch(tmp_path, "first", "--storage", storage, "--epochs", "4")
    assert first.returncode == 0, first.stderr[-3000:]
    journal = f"{tmp_path}/study.journal"
    measured = {t.number for t in _trials_journal(journal) if t.user_attrs.get("phase") == 0 and not t.user_attrs.get("interrupted")}
    second = _launch(tmp_path, "second", "--storage", storage, "--epochs", "2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "already measured" in second.stdout
    again = {t.number for t in _trials_journal(journal) if t.user_attrs.get("phase") == 0 and not t.user_attrs.get("interrupted")}
    assert again == measured


def _trials_journal(path: str) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))
    return optuna.load_study(study_name="omnivore", storage=storage).trials
