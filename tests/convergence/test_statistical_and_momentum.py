import math

import pytest

from omnikeras.convergence import (
    ConvergenceTimeModel,
    MeasuredHardwareModel,
    TrialMeasurement,
    implicit_momentum,
    measured_momentum,
    updates_to_target,
)


def test_a_geometric_fall_is_extrapolated() -> None:
    # Halved in 10 updates: from 1.0 to 0.125 takes 30 more.
    assert updates_to_target(2.0, 1.0, 10, 0.125) == pytest.approx(30.0)


@pytest.mark.parametrize(
    ("start", "end", "updates"),
    [(1.0, 1.2, 10), (1.0, 1.0, 10), (1.0, math.nan, 10), (math.inf, 0.5, 10), (1.0, 0.5, 0)],
    ids=["rising", "flat", "nan", "inf", "no-update"],
)
def test_no_progress_means_never(start: float, end: float, updates: int) -> None:
    assert updates_to_target(start, end, updates, 0.1) == math.inf


def test_a_loss_at_the_target_needs_no_more_updates() -> None:
    assert updates_to_target(0.5, 0.3, 10, 0.3) == pytest.approx(0.0)


def test_a_trial_past_the_target_reached_it_before_its_end() -> None:
    # Quartered in 10 updates: halved, to the target, after 5.
    assert updates_to_target(1.0, 0.25, 10, 0.5) == pytest.approx(-5.0)


def test_time_to_target_counts_the_trial_and_the_updates_after_it() -> None:
    model = ConvergenceTimeModel(0.125, MeasuredHardwareModel(num_workers=2))
    trial = TrialMeasurement(2, updates=20, seconds=3.0, start_loss=1.0, end_loss=0.25)
    estimate = model.estimate(trial)
    assert estimate.measured_seconds_per_update == pytest.approx(0.15)
    assert estimate.updates_to_target == pytest.approx(10.0)
    assert estimate.time_to_target == pytest.approx(3.0 + 0.15 * 10)
    # Past the target: it was there when the loss had fallen by ln 8 of its ln 10.
    passed = model.estimate(TrialMeasurement(2, updates=20, seconds=3.0, start_loss=1.0, end_loss=0.1))
    assert passed.time_to_target == pytest.approx(3.0 * math.log(8) / math.log(10))


def test_asynchrony_begets_momentum() -> None:
    assert [implicit_momentum(g) for g in (1, 2, 4)] == [0.0, 0.5, 0.75]
    # A geometric staleness with q = 0.6 measures as momentum 0.6.
    q = 0.6
    histogram = {lag: int(1e6 * (1 - q) * q**lag) for lag in range(60)}
    assert measured_momentum(histogram) == pytest.approx(q, abs=0.01)
    assert measured_momentum({}) == 0.0
