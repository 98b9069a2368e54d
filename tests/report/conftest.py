"""Fixtures: the same study in an SQLite file and in a journal file."""

import optuna
import pytest
from studies import record


@pytest.fixture
def sqlite_storage(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'omnivore.db'}"
    record(url)
    return url


@pytest.fixture
def journal_storage(tmp_path) -> str:
    path = str(tmp_path / "omnivore.journal")
    record(optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path)))
    return path
