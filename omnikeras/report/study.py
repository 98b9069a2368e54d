"""Opens the study an `OmnivoreCallback` left behind, for reading only."""

import optuna

from omnikeras.tuner.study import storage_for

DEFAULT_STUDY_NAME = "omnivore"


class ReportError(Exception):
    """The storage or the study cannot be read; the message says why."""


def load_study(storage: str, study_name: str | None = None) -> optuna.Study:
    """Loads a study from the storage `OmnivoreCallback` wrote it to.

    `storage` is what the callback accepts: an RDB URL (`sqlite:///runs/omnivore.db`) or
    the path of a journal file (anything without `://`). Unlike the callback, this never
    creates anything: a missing SQLite or journal file is an error, not an empty study.
    With no `study_name`, the storage's only study is used, or else the one named
    `"omnivore"`.

    Raises:
        ReportError: the storage cannot be opened, or holds no such study (the message
            lists the studies it does hold).

    Example:

    ```python
    study = load_study("sqlite:///runs/omnivore.db")
    print(len(study.trials))
    ```
    """
    try:
        opened = storage_for(storage, create=False)
    except FileNotFoundError as error:
        raise ReportError(f"{error} (from {storage})") from None
    try:
        names = optuna.study.get_all_study_names(opened)
    except Exception as error:  # SQLAlchemy, JSON and OS errors alike mean an unreadable storage.
        raise ReportError(f"cannot read studies from {storage}: {error}") from error
    if study_name is None:
        study_name = names[0] if len(names) == 1 else DEFAULT_STUDY_NAME
    if study_name not in names:
        held = ", ".join(sorted(names)) if names else "none"
        raise ReportError(f"no study named {study_name!r} in {storage} (studies there: {held}); choose one with --study")
    return optuna.load_study(study_name=study_name, storage=opened)
