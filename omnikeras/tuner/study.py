"""The Optuna study that records every trial: where it is stored, its default name, and
its pruner."""

import hashlib
import os
import pathlib

import numpy as np
import optuna
import optuna.storages.journal

DEFAULT_STORAGE_DIR = "runs"


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
        assert path is not None
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(os.fspath(path)))
    return storage


def _sqlite_file(url: str) -> pathlib.Path | None:
    return pathlib.Path(url.removeprefix("sqlite:///").split("?")[0]) if url.startswith("sqlite:///") else None


def default_study_name(architecture: str, parameters: int, batch_size: int, examples: int | None, target_loss: float) -> str:
    """A name that only the same model, batch size, data size and target share, so that
    a resumed study never reuses another model's trials.

    >>> default_study_name("Conv2D(32)>Dense(10)", 225034, 64, 60000, 0.3)
    'omnivore-7e3c8d5f-225034p-b64-n60000-t0.3'
    """
    digest = hashlib.sha256(architecture.encode()).hexdigest()[:8]
    return f"omnivore-{digest}-{parameters}p-b{batch_size}-n{examples if examples is not None else 'stream'}-t{target_loss:g}"


def open_study(storage: str | optuna.storages.BaseStorage | None, study_name: str, warmup_steps: int) -> optuna.Study:
    """Creates the study, or loads it to resume."""
    return optuna.create_study(
        study_name=study_name,
        storage=storage_for(storage),
        direction="minimize",
        load_if_exists=True,
        pruner=PeerPercentilePruner(75.0, n_startup_trials=3, n_warmup_steps=warmup_steps),
    )


class PeerPercentilePruner(optuna.pruners.BasePruner):
    """Prunes a trial whose intermediate value is worse than the `percentile` of its peers'
    at the same step. Peers are the completed trials of the same phase with the same
    number of groups: a worker's running loss only compares with runs of the same batch
    shares, and from the same snapshot.

    Args:
        percentile: Above this percentile of the peers' values, a trial is pruned.
        n_startup_trials: Peers needed before any trial is pruned.
        n_warmup_steps: Steps before which no trial is pruned.
    """

    def __init__(self, percentile: float, n_startup_trials: int, n_warmup_steps: int) -> None:
        self.percentile = percentile
        self.n_startup_trials = n_startup_trials
        self.n_warmup_steps = n_warmup_steps

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.n_warmup_steps:
            return False
        peers = [
            peer.intermediate_values[step]
            for peer in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if peer.user_attrs.get("phase") == trial.user_attrs.get("phase")
            and peer.params.get("num_groups") == trial.params.get("num_groups")
            and step in peer.intermediate_values
        ]
        if len(peers) < self.n_startup_trials:
            return False
        return bool(trial.intermediate_values[step] > np.percentile(peers, self.percentile))
