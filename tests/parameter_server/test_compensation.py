"""Compensated asynchrony: the momentum and learning rate in force for the staleness the
server measures, alone and on the server's update path."""

import math

import numpy as np
import pytest

from omnikeras.parameter_server.compensation import (
    MIN_MOMENTUM,
    OUTLIER,
    PRIOR_UPDATES,
    AsynchronyCompensation,
    InForce,
)
from omnikeras.parameter_server.groups import GroupCoordinator
from omnikeras.parameter_server.model_state import ModelState
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.v1 import parameter_server_pb2 as pb

DIM = 2000


def _warmed(num_groups: int, staleness: float, updates: int = 1500) -> AsynchronyCompensation:
    compensation = AsynchronyCompensation(num_groups)
    for _ in range(updates):
        compensation.in_force(0.01, 0.9)
        compensation.record(staleness, loss=1.0)
    return compensation


def test_one_group_applies_the_compiled_rule_exactly() -> None:
    compensation = AsynchronyCompensation(1)
    for _ in range(50):
        rule = compensation.in_force(0.0123, 0.9)
        compensation.record(0.0, loss=1.0)
    assert (rule.learning_rate, rule.momentum, rule.implicit_momentum) == (0.0123, 0.9, 0.0)


@pytest.mark.parametrize("groups", [2, 4, 8])
def test_the_explicit_momentum_gives_up_the_implicit_one_and_the_step_is_kept(groups: int) -> None:
    compensation = _warmed(groups, staleness=groups - 1)
    rule = compensation.in_force(0.01, 0.9)
    assert rule.implicit_momentum == pytest.approx(1 - 1 / groups)
    assert rule.momentum == pytest.approx(0.9 - (1 - 1 / groups))
    # The effective step, once warmed up: the compiled one.
    assert rule.learning_rate / (1 - rule.momentum) == pytest.approx(0.01 / (1 - 0.9))


def test_where_the_implicit_momentum_alone_is_larger_the_explicit_one_goes_below_zero() -> None:
    rule = _warmed(8, staleness=7).in_force(0.01, 0.5)
    assert rule.momentum == MIN_MOMENTUM
    assert rule.learning_rate == pytest.approx(0.02 * (1 - MIN_MOMENTUM))


def test_adams_beta_1_gives_up_the_implicit_momentum_down_to_zero_and_keeps_the_learning_rate() -> None:
    compensation = AsynchronyCompensation(4)
    for _ in range(1500):
        compensation.in_force(0.001, 0.9, "average")
        compensation.record(3.0, loss=1.0)
    rule = compensation.in_force(0.001, 0.9, "average")
    assert rule.momentum == pytest.approx(0.9 - 0.75)
    # A moving average's effective step is the learning rate itself.
    assert rule.learning_rate == pytest.approx(0.001)
    assert compensation.in_force(0.001, 0.5, "average").momentum == 0.0


def test_an_optimizer_without_momentum_keeps_it_at_zero_and_only_its_step_is_capped() -> None:
    compensation = AsynchronyCompensation(4)
    first = compensation.in_force(0.1, 0.0, "none")
    assert first.momentum == 0.0 and first.learning_rate < 0.1
    for _ in range(1500):
        compensation.in_force(0.1, 0.0, "none")
        compensation.record(3.0, loss=1.0)
    assert compensation.in_force(0.1, 0.0, "none") == pytest.approx(InForce(0.1, 0.0, 0.75))


def test_a_compiled_momentum_below_the_floor_is_kept() -> None:
    assert _warmed(4, staleness=3).in_force(0.01, -0.5).momentum == -0.5


def test_gradients_far_staler_than_usual_are_damped() -> None:
    compensation = _warmed(4, staleness=3)
    assert compensation.weight_of(3) == compensation.weight_of(7) == 1.0
    assert compensation.weight_of(79) == pytest.approx(OUTLIER * 4 / 80)
    assert AsynchronyCompensation(1).weight_of(100) == 1.0


def test_the_staleness_is_measured_leaning_on_taking_turns_until_then() -> None:
    compensation = AsynchronyCompensation(4)
    assert compensation.staleness == 3.0
    for _ in range(PRIOR_UPDATES):
        compensation.record(1.0, loss=None)
    assert compensation.staleness == pytest.approx(2.0)
    compensation.regroup(2)
    assert compensation.staleness == 1.0


def _safe_share(staleness: float, momentum: float) -> float:
    # Stable limits on the step times the curvature: about 1.5 / (s + 0.5) with a delay
    # of s updates, 2 (1 + mu) / (1 - mu) for heavy-ball momentum without.
    return 1.5 / (staleness + 0.5) / (2 * (1 + momentum) / (1 - momentum))


def test_the_step_warms_up_from_a_safe_share_of_the_compiled_one_and_each_layout_keeps_its_own() -> None:
    compensation = AsynchronyCompensation(4)
    first = compensation.in_force(0.01, 0.9)
    assert first.learning_rate / (1 - first.momentum) == pytest.approx(0.1 * _safe_share(3, 0.9))
    for _ in range(1000):
        compensation.in_force(0.01, 0.9)
        compensation.record(3.0, loss=1.0)
    compensation.regroup(8)
    eight = compensation.in_force(0.01, 0.9)
    assert eight.learning_rate / (1 - eight.momentum) == pytest.approx(0.1 * _safe_share(7, 0.9))
    # Without momentum to lose, a short delay leaves a large share.
    assert AsynchronyCompensation(2).in_force(0.1, 0.0).learning_rate == pytest.approx(0.1 * 0.5 * (1 - MIN_MOMENTUM))
    compensation.regroup(4)
    back = compensation.in_force(0.01, 0.9)
    assert back.learning_rate / (1 - back.momentum) == pytest.approx(0.1)


def _turns(
    coordinator: GroupCoordinator, groups: int, updates: int, loss: float | None = None, first_step: int = 1
) -> None:
    """Groups taking turns on a noisy quadratic, each computing at the version its own
    last update made; their workers register at the first step."""
    rng = np.random.default_rng(first_step)
    curvature = rng.uniform(0.1, 1.0, DIM).astype(np.float32)
    workers = [coordinator.register(worker_id=i + 1)[0] for i in range(groups)]
    held = dict.fromkeys(workers, coordinator.model.version)
    weights = {held[workers[0]]: coordinator.model.weights["w"].copy()}
    for step in range(first_step, first_step + updates // groups):
        for worker in workers:
            gradient = curvature * weights[held[worker]] + rng.normal(size=DIM).astype(np.float32)
            result = coordinator.push(worker, step, held[worker], 1, {"w": gradient.astype(np.float32)}, loss=loss)
            held[worker] = result.model_version
            weights[result.model_version] = coordinator.model.weights["w"].copy()


@pytest.mark.parametrize("compensate", [True, False])
def test_the_meter_finds_the_momentum_in_force_with_and_without_compensation(compensate: bool) -> None:
    rule = Hyperparameters(0.01, momentum=0.9, compensate_asynchrony=compensate)
    coordinator = GroupCoordinator(ModelState(rule), num_groups=4, measure_momentum=True)
    coordinator.initialize({"w": np.random.default_rng(1).normal(size=DIM).astype(np.float32)}, rule)
    _turns(coordinator, 4, updates=1000, loss=1.0)
    stats = coordinator.stats()
    assert stats.implicit_momentum == pytest.approx(0.75, abs=0.01)
    explicit = stats.momentum_in_force
    if compensate:
        assert explicit == pytest.approx(0.9 - 0.75, abs=0.01)
        assert stats.learning_rate_in_force == pytest.approx(0.01 / 0.1 * (1 - explicit))
    else:
        assert (explicit, stats.learning_rate_in_force) == (0.9, 0.01)
    # The meter, from the updates themselves, finds what was applied: mean lags of 3 from
    # the turns and mu / (1 - mu) from the explicit momentum, making up m / (1 + m).
    lag = 3 + explicit / (1 - explicit)
    assert stats.total_momentum == pytest.approx(lag / (1 + lag), abs=0.03)


def test_a_restored_snapshot_brings_back_its_caps_and_a_restored_server_measures_afresh() -> None:
    rule = Hyperparameters(0.01, momentum=0.9)
    coordinator = GroupCoordinator(ModelState(rule), num_groups=2)
    coordinator.initialize({"w": np.ones(DIM, np.float32)}, rule)
    cold_share = _safe_share(1, 0.9)
    coordinator.save_snapshot("cold")
    _turns(coordinator, 2, updates=400)
    warmed = coordinator.stats()
    assert warmed.learning_rate_in_force / (1 - warmed.momentum_in_force) == pytest.approx(0.1)
    assert warmed.step_share == pytest.approx(1.0)
    coordinator.save_snapshot("warm")
    # Every trial from one snapshot starts under the caps it was saved with.
    coordinator.restore_snapshot("cold")
    assert coordinator.stats().step_share == pytest.approx(cold_share)
    coordinator.restore_snapshot("warm")
    assert coordinator.stats().step_share == pytest.approx(1.0)
    coordinator.restore(coordinator.checkpoint_state())
    fresh = coordinator.stats()
    assert fresh.learning_rate_in_force / (1 - fresh.momentum_in_force) == pytest.approx(0.1 * cold_share)
    assert fresh.step_share == pytest.approx(cold_share)
    # The checkpoint kept the snapshots' weights but not their caps: fresh ones.
    coordinator.restore_snapshot("warm")
    assert coordinator.stats().step_share == pytest.approx(cold_share)


def test_a_climbing_loss_halves_the_step_on_the_server() -> None:
    rule = Hyperparameters(0.01, momentum=0.9)
    coordinator = GroupCoordinator(ModelState(rule), num_groups=2)
    coordinator.initialize({"w": np.ones(DIM, np.float32)}, rule)
    _turns(coordinator, 2, updates=400, loss=1.0)
    assert coordinator.stats().step_backoffs == 0
    _turns(coordinator, 2, updates=40, loss=100.0, first_step=201)
    stats = coordinator.stats()
    assert stats.step_backoffs == 1
    assert stats.learning_rate_in_force / (1 - stats.momentum_in_force) == pytest.approx(0.05)
    assert stats.step_share == pytest.approx(0.5)


def test_the_choice_travels_in_the_hyperparameters() -> None:
    assert Hyperparameters().compensate_asynchrony
    off = Hyperparameters(0.05, compensate_asynchrony=False)
    assert Hyperparameters.from_proto(off.to_proto()) == off
    assert Hyperparameters.from_proto(Hyperparameters(0.05).to_proto()).compensate_asynchrony
    # A message that does not say so applies the rule as it is.
    assert not Hyperparameters.from_proto(pb.Hyperparameters(learning_rate=0.05)).compensate_asynchrony
    assert math.isfinite(Hyperparameters.from_proto(off.to_proto()).learning_rate)


def test_a_spiking_gradient_is_applied_at_the_usual_size_and_halves_the_step_on_the_server() -> None:
    rule = Hyperparameters(0.01, momentum=0.9)
    coordinator = GroupCoordinator(ModelState(rule), num_groups=2)
    coordinator.initialize({"w": np.ones(DIM, np.float32)}, rule)
    _turns(coordinator, 2, updates=400, loss=1.0)
    before = coordinator.stats()
    assert before.step_backoffs == 0
    worker = coordinator.register(worker_id=1)[0]
    version = coordinator.model.version
    weights = coordinator.model.weights["w"].copy()
    # Gradients computed at weights a step threw off: a hundred times the usual size.
    thrown = 100 * np.random.default_rng(2).normal(size=DIM).astype(np.float32)
    coordinator.push(worker, 201, version, 1, {"w": thrown.copy()}, loss=1.0)
    moved = np.abs(coordinator.model.weights["w"] - weights).sum()
    assert moved < 0.2 * before.learning_rate_in_force * np.abs(thrown).sum()
    after = coordinator.stats()
    assert after.step_backoffs == 1
    assert after.step_share == pytest.approx(0.5 * before.step_share)
