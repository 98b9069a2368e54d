import math

import numpy as np
import pytest

from omnikeras.convergence import (
    ConvergenceTimeModel,
    MeasuredHardwareModel,
    TrialMeasurement,
    explicit_momentum_candidates,
    implicit_momentum,
    measured_momentum,
    updates_to_target,
)


def test_an_exponential_decay_is_extrapolated() -> None:
    updates = np.arange(0, 200, 10)
    losses = 2.0 * np.exp(-0.01 * updates) * np.random.default_rng(0).uniform(0.97, 1.03, len(updates))
    # From 2 e^{-1.9} at update 190 down to 0.1: ln(2 e^{-1.9} / 0.1) / 0.01 updates.
    expected = (math.log(2.0 / 0.1) - 1.9) / 0.01
    assert updates_to_target(updates, losses, 0.1) == pytest.approx(expected, rel=0.15)


@pytest.mark.parametrize(
    "losses",
    [[1.0, 1.0, 1.1, 1.2], [1.0, float("nan"), 0.5, 0.4], [1.0, 0.9]],
    ids=["rising", "nan", "too-few"],
)
def test_no_progress_means_never(losses: list[float]) -> None:
    assert updates_to_target(range(0, 10 * len(losses), 10), losses, 0.1) == math.inf


def test_a_loss_below_the_target_needs_no_more_updates() -> None:
    assert updates_to_target([0, 1, 2, 3], [0.5, 0.4, 0.3, 0.2], 0.3) == 0.0


def test_time_to_target_is_seconds_per_update_times_updates() -> None:
    model = ConvergenceTimeModel(0.125, MeasuredHardwareModel(num_workers=2))
    trial = TrialMeasurement(2, updates=[0, 10, 20, 30], losses=[1.0, 0.5, 0.25, 0.125 * 2], seconds=3.0)
    estimate = model.estimate(trial)
    assert estimate.measured_seconds_per_update == pytest.approx(0.1)
    assert estimate.time_to_target == pytest.approx(0.1 * estimate.updates_to_target)


def test_asynchrony_begets_momentum() -> None:
    assert [implicit_momentum(g) for g in (1, 2, 4)] == [0.0, 0.5, 0.75]
    # A geometric staleness with q = 0.6 measures as momentum 0.6.
    q = 0.6
    histogram = {lag: int(1e6 * (1 - q) * q**lag) for lag in range(60)}
    assert measured_momentum(histogram) == pytest.approx(q, abs=0.01)
    assert measured_momentum({}) == 0.0


def test_explicit_momentum_stays_below_the_total() -> None:
    assert explicit_momentum_candidates((0.0, 0.3, 0.6, 0.9), 0.9, implicit_momentum(1)) == [0.0, 0.3, 0.6, 0.9]
    assert explicit_momentum_candidates((0.3, 0.6, 0.9), 0.9, implicit_momentum(4)) == [0.0]
