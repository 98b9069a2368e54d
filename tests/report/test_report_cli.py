"""`omnikeras report` writes a readable report of a study, and says clearly what it cannot read."""

import pathlib
import subprocess
import sys

import pytest
from studies import TRIALS, record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_FIGURES = (
    "history.png",
    "intermediate_values.png",
    "param_importances.png",
    "seconds_per_update.png",
    "phases.png",
    "loss_curve.png",
)


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omnikeras", "report", *args], capture_output=True, text=True, timeout=120
    )


def assert_png(path: pathlib.Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), path
    assert len(data) > 5000, f"{path} is only {len(data)} bytes"


@pytest.mark.parametrize("storage", ["sqlite_storage", "journal_storage"])
def test_report_of_a_study_with_phases(request, tmp_path, storage: str) -> None:
    out = tmp_path / "report"
    run = report(request.getfixturevalue(storage), "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(out / "index.html")
    for name in ALL_FIGURES:
        assert_png(out / name)
    page = (out / "index.html").read_text()
    for name in ALL_FIGURES:
        assert f'src="{name}"' in page
    assert "Not drawn" not in page
    assert "phase 0: 4 groups, momentum 0.6, learning rate 0.01" in page
    assert "phase 1: 4 groups, momentum 0.3, learning rate 0.01" in page
    assert "Best trial: #5" in page
    assert page.count("<tr>") == len(TRIALS) + 1
    assert "∞" in page  # the pruned and diverged trials' time to target


def test_single_trial_says_why_figures_are_missing(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'one.db'}"
    record(url, study_name="first-run", trials=TRIALS[:1])
    out = tmp_path / "report"
    # The storage's only study is used when none is named.
    run = report(url, "--out", str(out))
    assert run.returncode == 0, run.stderr
    page = (out / "index.html").read_text()
    assert "Omnivore study first-run" in page
    assert "Not drawn: needs at least 2 completed trials; the study has 1." in page
    assert "Not drawn: the study holds no loss curve" in page
    assert "no phase finished tuning" in page
    assert_png(out / "history.png")
    assert not (out / "param_importances.png").exists()


def test_missing_study_name_lists_the_studies(sqlite_storage: str, tmp_path) -> None:
    record(sqlite_storage, study_name="second")
    run = report(sqlite_storage, "--study", "third", "--out", str(tmp_path / "report"))
    assert run.returncode == 2
    assert "no study named 'third'" in run.stderr
    assert "studies there: omnivore, second" in run.stderr
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    "storage, message",
    [
        ("sqlite:///{tmp}/missing.db", "no SQLite file at"),
        ("{tmp}/missing.journal", "no journal file at"),
        ("sqlite:///{tmp}/not-a-database.db", "cannot read studies from"),
    ],
)
def test_bad_storage_exits_with_a_message(tmp_path, storage: str, message: str) -> None:
    (tmp_path / "not-a-database.db").write_text("just text, long enough to not be an empty database file\n" * 10)
    run = report(storage.format(tmp=tmp_path), "--out", str(tmp_path / "report"))
    assert run.returncode == 2
    assert message in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "missing.db").exists()
    assert not (tmp_path / "missing.journal").exists()
