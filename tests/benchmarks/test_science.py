"""The science study: its analysis on made-up trials, and a quick run through the real
parts (a check that it runs and writes its page; no figure is asserted)."""

import json
import math
import pathlib
import subprocess
import sys

import pytest

from omnikeras.emulation import ClusterSpec, missing_requirements

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import science  # noqa: E402


def _trial(
    groups: int, momentum: float, loss: float | None, total: float | None = None, seed: int = 0, rate: float = 0.1,
    compensated: bool = False, to_target: int | None = None,
) -> dict:
    return {
        "seed": seed, "groups": groups, "learning_rate": rate, "momentum": momentum, "compensated": compensated,
        "loss": loss, "updates_to_target": to_target, "updates": 150, "total_momentum": total,
        "mean_staleness": groups - 1.0,
    }


def test_the_best_momentum_is_the_lowest_mean_loss_and_a_diverged_seed_rules_a_setting_out() -> None:
    trials = [
        _trial(1, 0.0, 0.5), _trial(1, 0.9, 0.3), _trial(1, 0.9, 0.31, seed=1), _trial(1, 0.0, 0.5, seed=1),
        _trial(4, 0.0, 0.32), _trial(4, 0.0, 0.33, seed=1), _trial(4, 0.9, 0.1), _trial(4, 0.9, None, seed=1),
    ]
    assert science.best_momenta(trials) == {1: 0.9, 4: 0.0}


def test_tuning_takes_the_fewest_updates_to_the_target_at_each_number_of_groups() -> None:
    trials = [
        _trial(1, 0.9, 0.2, to_target=90), _trial(1, 0.0, 0.1, rate=0.3, to_target=60),
        _trial(2, 0.0, 0.4), _trial(2, 0.3, 0.11, rate=0.3, to_target=75), _trial(2, 0.3, 0.12, rate=0.3, seed=1, to_target=90),
        _trial(2, 0.9, 0.05, compensated=True, to_target=60), _trial(2, 0.9, 0.05, compensated=True, seed=1),
        _trial(2, 0.9, None, rate=0.3),
    ]
    tuned = science.best_tuned(trials)
    assert tuned[1] == science.Tuned(0.3, 0.0, False, 60, True)
    # The compensated setting missed the target in one seed: the mean over both seeds counts.
    assert tuned[2] == science.Tuned(0.3, 0.3, False, 82.5, True)
    assert science.tuned_over_sync(trials) == {2: pytest.approx(82.5 / 60)}
    # Experiment 2 reads one learning rate only.
    assert science.best_momenta(science.at_rate(science.compensated(trials, False), 0.1)) == {1: 0.9, 2: 0.0}


def test_where_no_setting_reaches_the_target_its_updates_count_as_a_bound() -> None:
    trials = [_trial(1, 0.9, 0.1, to_target=50), _trial(4, 0.0, 0.4), _trial(4, 0.3, 0.3)]
    assert science.best_tuned(trials)[4] == science.Tuned(0.1, 0.3, False, 150, False)
    assert science.tuned_over_sync(trials) == {4: pytest.approx(3.0)}


def test_compensation_is_scored_by_its_best_loss_over_the_best_uncompensated_one() -> None:
    trials = [
        _trial(1, 0.9, 0.1), _trial(2, 0.0, 0.4), _trial(2, 0.6, 0.3),
        _trial(2, 0.9, 0.15, compensated=True), _trial(2, 0.6, 0.2, compensated=True),
    ]
    assert science.compensated_over_uncompensated(trials) == {2: pytest.approx(0.5)}
    assert science.best_momenta(science.compensated(trials, False)) == {1: 0.9, 2: 0.6}


def test_implicit_momentum_errors_compare_the_measured_total_with_one_minus_one_over_g() -> None:
    trials = [_trial(1, 0.0, 1.0, total=0.02), _trial(2, 0.0, 1.0, total=0.4), _trial(2, 0.0, 1.0, total=0.5, seed=1)]
    errors = science.implicit_momentum_errors(trials)
    assert errors[1] == pytest.approx(0.02)
    assert errors[2] == pytest.approx(0.05)
    assert math.isnan(science.measured_total_momentum(trials, 4, 0.0))


def test_the_hardware_model_is_scored_on_the_most_groups_from_the_fewer_ones() -> None:
    errors = science.he_errors({1: 0.4, 2: 0.25, 4: 0.175, 8: 0.1})
    assert set(errors) == {8}
    predicted, error = errors[8]
    # 0.1 + 0.3 / g fits 1, 2 and 4 exactly.
    assert predicted == pytest.approx(0.1375)
    assert error == pytest.approx(0.375)


def test_the_page_keeps_what_lies_outside_its_results(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "science.md"
    page.write_text(f"# Method\n\n{science.START}\nold\n{science.END}\n\n## Discussion\n")
    science.write_page(page, f"{science.START}\nnew\n{science.END}")
    assert page.read_text() == f"# Method\n\n{science.START}\nnew\n{science.END}\n\n## Discussion\n"


def test_each_optimizers_results_keep_the_others_on_the_page(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "science.md"
    page.write_text(f"# Method\n\n{science.START}\nold SGD\n{science.END}\n\n## Discussion\n")
    # The first Adam run finds no markers of its own: its results go at the end.
    science.write_page(page, f"{science.ADAM_START}\nAdam\n{science.ADAM_END}", science.ADAM.markers)
    science.write_page(page, f"{science.START}\nnew SGD\n{science.END}")
    assert page.read_text() == (
        f"# Method\n\n{science.START}\nnew SGD\n{science.END}\n\n## Discussion\n\n"
        f"{science.ADAM_START}\nAdam\n{science.ADAM_END}\n"
    )


def _adam_trials() -> list[dict]:
    """The Adam grid at 1 and 2 groups: 0.9 best synchronous, 0.3 with 2 groups, and
    compensated 0.9 better still."""
    losses = {1: (0.5, 0.4, 0.35, 0.3, 0.32), 2: (0.45, 0.4, 0.5, 0.8, 0.9)}
    trials = [_trial(g, beta, loss, total=(g - 1) / g) for g in (1, 2) for beta, loss in zip(science.ADAM_BETAS, losses[g])]
    compensated = zip(science.ADAM_COMPENSATED_BETAS, (0.44, 0.42, 0.36, 0.5))
    return trials + [_trial(2, beta, loss, compensated=True) for beta, loss in compensated]


def test_adams_figures_are_its_own_keys_and_leave_experiments_3_and_4_null() -> None:
    setup = science.Setup("digits", "MLP on digits", 4, (1, 2), 150, (0.1,), (0,), 0.2)
    figures = science.figures_of(science.ADAM, {setup: _adam_trials()}, None)
    assert set(figures) == {
        "adam_implicit_momentum_max_error", "adam_best_momentum_non_increasing",
        "adam_compensated_over_uncompensated_loss", "adam_tuned_async_over_sync_updates", "adam_he_prediction_error",
    }
    assert figures["adam_implicit_momentum_max_error"] == 0.0
    assert figures["adam_best_momentum_non_increasing"] is True
    # 0.36 compensated at compiled 0.9, against 0.4 uncompensated at 0.3.
    assert figures["adam_compensated_over_uncompensated_loss"] == 0.9
    assert figures["adam_tuned_async_over_sync_updates"] is None and figures["adam_he_prediction_error"] is None
    page = science.results_markdown(science.ADAM, {setup: _adam_trials()}, None, figures, "as processes on one host")
    assert page.startswith(science.ADAM_START) and page.endswith(science.ADAM_END)
    assert "### Adam: Loss over explicit beta_1 (experiment 2)" in page and "| +0.95 |" in page
    assert "experiment 3" not in page and "experiment 4" not in page


@pytest.mark.slow
@pytest.mark.benchmark_run
def test_quick_study_runs_through_launched_clusters_and_writes_its_page(tmp_path: pathlib.Path) -> None:
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "science.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=1200,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(figures) == {
        "implicit_momentum_max_error", "best_momentum_non_increasing", "compensated_over_uncompensated_loss",
        "tuned_async_over_sync_updates", "he_prediction_error",
    }
    page = (tmp_path / "science.md").read_text()
    assert science.START in page and json.dumps(figures) in page
    assert (tmp_path / "science_implicit_momentum.png").stat().st_size > 0
    assert (tmp_path / "science_momentum.png").stat().st_size > 0
    # Every trial of the quick grid made it into the table: one row per number of groups.
    assert page.count("| 1 | ") >= 1 and page.count("| 4 | ") >= 1
    emulable = not missing_requirements(ClusterSpec.from_dict("four-halves-1gbit", science.QUICK_CLUSTER_FIELDS))
    where = "on the emulated cluster four-halves-1gbit, one worker per host" if emulable else "as processes on one host"
    assert f"Every trial ran {where}." in page
    assert (figures["he_prediction_error"] is not None) == emulable


def test_trials_run_a_worker_per_emulated_host_or_processes_on_this_host() -> None:
    setup = science.QUICK[0]
    assert science.cluster_options(setup, "four-halves.json") == ["--emulate", "four-halves.json"]
    assert science.cluster_options(setup, None) == ["--workers", "4", "--no-merge"]
