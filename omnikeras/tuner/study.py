"""The Optuna study that records every trial, and where it is stored."""

import math
import os
import pathlib

import optuna

from omnikeras.tuner.search import Config, Outcome

DEFAULT_STORAGE_DIR = "runs"

DISTRIBUTIONS: dict[str, optuna.distributions.BaseDistribution] = {
    "num_groups": optuna.distributions.IntDistribution(1, 1024),
    "learning_rate": optuna.distributions.FloatDistribution(1e-8, 100.0, log=True),
    "momentum": optuna.distributions.FloatDistribution(-0.99, 0.99),
}


def storage_for(
    storage: str | optuna.storages.BaseStorage | None, create: bool = True
) -> str | optuna.storages.BaseStorage:
    """An Optuna storage: an SQLite file in `runs/` by default, any RDB URL as given, or
    a journal file for a path with no URL scheme. With `create=False`, a missing SQLite
    or journal file raises FileNotFoundError instead of being created."""
    if storage is None:
        storage = f"sqlite:///{DEFAULT_STORAGE_DIR}/omnivore.db"
    if not isinstance(storage, str):
        return storage
    journal = "://" not in storage
    path = pathlib.Path(storage) if journal else _sqlite_file(storage)
    if path is not None:
        if not create and not path.is_file():
            raise FileNotFoundError(f"no {'journal' if journal else 'SQLite'} file at {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
    if journal:
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(os.fspath(path)))
    return storage


def _sqlite_file(url: str) -> pathlib.Path | None:
    return pathlib.Path(url.removeprefix("sqlite:///").split("?")[0]) if url.startswith("sqlite:///") else None


def open_study(storage: str | optuna.storages.BaseStorage | None, study_name: str, warmup_steps: int) -> optuna.Study:
    """Creates the study, or loads it to resume; a trial among the worst quarter of the
    earlier ones at the same step is pruned."""
    return optuna.create_study(
        study_name=study_name,
        storage=storage_for(storage),
        direction="minimize",
        load_if_exists=True,
        pruner=optuna.pruners.PercentilePruner(75.0, n_startup_trials=3, n_warmup_steps=warmup_steps),
    )


def params_of(config: Config) -> dict[str, float]:
    return {"num_groups": config.num_groups, "learning_rate": config.learning_rate, "momentum": config.momentum}


def finished_trial(study: optuna.Study, phase: int, config: Config) -> optuna.trial.FrozenTrial | None:
    """A trial of `config` in `phase` that an earlier run finished, if any."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)):
        if trial.user_attrs.get("phase") != phase or trial.user_attrs.get("interrupted"):
            continue
        params = trial.params
        if (
            params.get("num_groups") == config.num_groups
            and math.isclose(params.get("learning_rate", -1), config.learning_rate, rel_tol=1e-9)
            and math.isclose(params.get("momentum", -2), config.momentum, abs_tol=1e-9)
        ):
            return trial
    return None


def outcome_of(trial: optuna.trial.FrozenTrial) -> Outcome:
    return Outcome(
        time_to_target=trial.user_attrs.get("time_to_target", math.inf),
        diverged=trial.user_attrs.get("diverged", False),
    )
