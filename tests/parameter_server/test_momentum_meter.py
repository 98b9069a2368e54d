"""The momentum meter against update sequences whose total momentum is known."""

import math
import threading

import numpy as np
import pytest

from omnikeras.launcher.launcher import server_args
from omnikeras.parameter_server.groups import GroupCoordinator
from omnikeras.parameter_server.model_state import ModelState
from omnikeras.parameter_server.momentum_meter import MIN_UPDATES, MomentumMeter, lags_for
from omnikeras.parameter_server.optimizers import Step, optimizer_named
from omnikeras.parameter_server.update_rule import Hyperparameters

DIM = 2000


def _train(
    groups: int, momentum: float, updates: int, lags: int, take_turns: bool = True,
    meter: "list[MomentumMeter] | None" = None,
) -> MomentumMeter:
    """SGD with momentum on a noisy quadratic, `groups` groups each computing at the
    version its own last update made, as the server sees them; returns the meter that
    recorded it (also put in `meter`, for a reader that starts before)."""
    rng = np.random.default_rng(0)
    curvature = rng.uniform(0.1, 1.0, DIM)
    x, velocity = rng.normal(size=DIM), np.zeros(DIM)
    recorder = MomentumMeter({"w": x}, lags=lags)
    if meter is not None:
        meter.append(recorder)
    held, versions = [0] * groups, {0: x.copy()}
    for version in range(updates):
        group = version % groups if take_turns else int(rng.integers(groups))
        gradient = curvature * versions[held[group]] + rng.normal(size=DIM)
        velocity = momentum * velocity - 0.05 * gradient
        x = x + velocity
        recorder.record(version, [(held[group], recorder.sample({"w": gradient}), 1.0)], 0.05, {"w": x})
        versions[version + 1], held[group] = x.copy(), version + 1
    return recorder


def _train_adam(groups: int, beta_1: float, updates: int, settings: "dict[str, float] | None" = None) -> MomentumMeter:
    """The server's Adam on a noisy quadratic whose gradients' sizes span 100 times over
    the coordinates, `groups` groups taking turns as in `_train`; the meter divides each
    update by Adam's rate of each coordinate."""
    rng = np.random.default_rng(0)
    curvature, sizes = rng.uniform(0.1, 1.0, DIM), rng.permutation(np.logspace(-1, 1, DIM))
    adam = optimizer_named("Adam", settings)
    x = rng.normal(size=DIM)
    slots = adam.slots(x, Step(0.01, beta_1, 0))
    meter = MomentumMeter({"w": x}, lags=lags_for(groups, beta_1))
    held, versions = [0] * groups, {0: x.copy()}
    for version in range(updates):
        group = version % groups
        gradient = sizes * (curvature * versions[held[group]] + rng.normal(size=DIM))
        step = Step(0.01, beta_1, version)
        x, slots = adam.update(x, gradient, slots, step)
        sampled = {slot: meter.sample_of("w", slots[slot]) for slot in adam.rate_slots()}
        rate = meter.joined({"w": adam.applied_rate(step, sampled)})
        meter.record(version, [(held[group], meter.sample({"w": gradient}), 1.0)], rate, {"w": x})
        versions[version + 1], held[group] = x.copy(), version + 1
    return meter


@pytest.mark.parametrize("settings", [{}, {"amsgrad": 1.0}])
@pytest.mark.parametrize("beta_1", [0.0, 0.6])
def test_synchronous_adam_is_measured_as_its_beta_1(beta_1: float, settings: dict[str, float]) -> None:
    # Its moving average's mean lag, beta_1 / (1 - beta_1), is heavy-ball beta_1's.
    assert _train_adam(1, beta_1, updates=300, settings=settings).total_momentum() == pytest.approx(beta_1, abs=0.02)


def test_adam_in_groups_taking_turns_brings_one_minus_one_over_g() -> None:
    assert _train_adam(2, 0.0, updates=300).total_momentum() == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize("settings", [{}, {"amsgrad": 1.0}])
def test_adams_update_over_its_applied_rate_is_its_moving_average(settings: dict[str, float]) -> None:
    rng = np.random.default_rng(0)
    adam, x = optimizer_named("Adam", settings), rng.normal(size=100)
    slots = adam.slots(x, Step(0.01, 0.9, 0))
    for iteration in range(5):
        step = Step(0.01, 0.9, iteration)
        after, slots = adam.update(x, rng.normal(size=100) * 10.0 ** rng.uniform(-2, 2, 100), slots, step)
        rate = adam.applied_rate(step, {slot: slots[slot] for slot in adam.rate_slots()})
        np.testing.assert_allclose((x - after) / rate, slots["momentum"], rtol=1e-9)
        x = after


def test_coordinates_with_a_rate_of_zero_or_not_finite_are_left_out() -> None:
    rng = np.random.default_rng(0)
    x = np.zeros(DIM)
    meter = MomentumMeter({"w": x})
    rate = np.full(len(meter.sample({"w": x})), 0.1)
    rate[:50], rate[50:100], rate[100:150] = 0.0, np.nan, np.inf
    for version in range(80):  # synchronous SGD, no momentum
        g = rng.normal(size=DIM)
        x = x - 0.1 * g
        meter.record(version, [(version, meter.sample({"w": g}), 1.0)], rate, {"w": x})
    assert meter.total_momentum() == pytest.approx(0.0, abs=0.02)


@pytest.mark.parametrize("groups", [1, 2, 4, 8])
def test_groups_taking_turns_bring_momentum_one_minus_one_over_g(groups: int) -> None:
    meter = _train(groups, momentum=0.0, updates=300, lags=lags_for(groups, 0.0))
    assert meter.total_momentum() == pytest.approx(1 - 1 / groups, abs=0.02)


@pytest.mark.parametrize("groups", [2, 4, 8])
def test_groups_at_random_bring_about_the_same(groups: int) -> None:
    meter = _train(groups, momentum=0.0, updates=600, lags=lags_for(groups, 0.0), take_turns=False)
    assert meter.total_momentum() == pytest.approx(1 - 1 / groups, abs=0.1)


@pytest.mark.parametrize("momentum", [-0.3, 0.3, 0.6])
def test_synchronous_momentum_is_measured_as_itself(momentum: float) -> None:
    meter = _train(1, momentum, updates=300, lags=lags_for(1, momentum))
    assert meter.total_momentum() == pytest.approx(momentum, abs=0.02)


def test_explicit_and_implicit_momentum_add_up_in_mean_lag() -> None:
    meter = _train(4, momentum=0.5, updates=300, lags=lags_for(4, 0.5))
    # Mean lags add: 3 from the turns, 0.5 / 0.5 = 1 from the momentum.
    assert meter.total_momentum() == pytest.approx(4 / 5, abs=0.02)


def test_nothing_is_measured_before_enough_updates() -> None:
    assert math.isnan(MomentumMeter({"w": np.zeros(DIM)}).total_momentum())
    # An update is resolved 8 updates after it was applied.
    assert math.isnan(_train(2, momentum=0.0, updates=8 + MIN_UPDATES - 1, lags=8).total_momentum())
    meter = _train(2, momentum=0.0, updates=60, lags=8)
    # Both groups start at version 0, whose gradients then land at two lags.
    assert meter.total_momentum() == pytest.approx(0.5, abs=0.05)


def test_coordinates_are_sampled_by_size_leaving_out_variables_of_a_handful() -> None:
    weights = {"bias": np.zeros(10), "kernel": np.ones((3, 1000)), "other": np.full(300, 2.0)}
    sampled = MomentumMeter(weights, coordinates=500).sample(weights)
    # About 10/4310 of 500 for the bias: too few to be worth sampling on every update.
    assert 450 < len(sampled) <= 500
    assert set(np.unique(sampled)) == {1.0, 2.0}
    assert len(MomentumMeter({"bias": np.zeros(10)}, coordinates=5).sample({"bias": np.zeros(10)})) == 5


def test_the_server_reports_the_momentum_of_its_groups_and_forgets_it_on_restore() -> None:
    coordinator = GroupCoordinator(ModelState(Hyperparameters(0.05)), num_groups=4, measure_momentum=True)
    rng = np.random.default_rng(0)
    coordinator.initialize({"w": rng.normal(size=DIM).astype(np.float32)}, Hyperparameters(0.05))
    coordinator.save_snapshot("start")
    workers = [coordinator.register()[0] for _ in range(4)]
    held = dict.fromkeys(workers, 0)
    for step in range(1, 121):
        for worker in workers:
            gradient = coordinator.model.weights["w"] + rng.normal(size=DIM).astype(np.float32)
            result = coordinator.push(worker, step, held[worker], 1, {"w": gradient.astype(np.float32)})
            held[worker] = result.model_version
    assert coordinator.stats().total_momentum == pytest.approx(0.75, abs=0.05)
    coordinator.restore_snapshot("start")
    assert math.isnan(coordinator.stats().total_momentum)


@pytest.mark.parametrize(("groups", "beta_1", "expected"), [(1, 0.6, 0.6), (2, 0.0, 0.5)])
def test_the_server_measures_adam_over_its_rate_of_each_coordinate(groups: int, beta_1: float, expected: float) -> None:
    # A statistic (a moving mean) besides: it takes the changes pushed, has no optimizer
    # state and is left out of the measurement.
    rule = Hyperparameters(
        0.01, momentum=beta_1, optimizer="Adam", statistics=frozenset({"mean"}), compensate_asynchrony=False
    )
    coordinator = GroupCoordinator(ModelState(rule), num_groups=groups, measure_momentum=True)
    rng = np.random.default_rng(0)
    sizes = rng.permutation(np.logspace(-1, 1, DIM)).astype(np.float32)
    coordinator.initialize({"w": rng.normal(size=DIM).astype(np.float32), "mean": np.zeros(DIM, np.float32)}, rule)
    workers = [coordinator.register()[0] for _ in range(groups)]
    held = dict.fromkeys(workers, 0)
    for step in range(1, 301 // groups):
        for worker in workers:
            gradient = sizes * (coordinator.model.weights["w"] + rng.normal(size=DIM).astype(np.float32))
            change = rng.normal(size=DIM).astype(np.float32)
            result = coordinator.push(worker, step, held[worker], 1, {"w": gradient, "mean": change})
            held[worker] = result.model_version
    assert coordinator.stats().total_momentum == pytest.approx(expected, abs=0.03)


def test_a_new_layout_or_momentum_starts_a_new_measurement() -> None:
    coordinator = GroupCoordinator(ModelState(Hyperparameters(0.05)), num_groups=1, measure_momentum=True)
    coordinator.initialize({"w": np.zeros(DIM, np.float32)}, Hyperparameters(0.05))
    worker = coordinator.register()[0]
    rng = np.random.default_rng(0)
    for step in range(1, 41):
        coordinator.push(worker, step, step - 1, 1, {"w": rng.normal(size=DIM).astype(np.float32)})
    assert coordinator.stats().total_momentum == pytest.approx(0.0, abs=0.02)
    coordinator.set_hyperparameters(Hyperparameters(0.05, momentum=0.5))
    assert math.isnan(coordinator.stats().total_momentum)
    for step in range(41, 101):
        coordinator.push(worker, step, step - 1, 1, {"w": rng.normal(size=DIM).astype(np.float32)})
    assert coordinator.stats().total_momentum == pytest.approx(0.5, abs=0.05)
    coordinator.set_groups(2, {})
    assert math.isnan(coordinator.stats().total_momentum)


def test_reading_while_updates_are_recorded_loses_none_of_them() -> None:
    meters: list[MomentumMeter] = []
    readings: list[float] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            if meters:
                readings.append(meters[0].total_momentum())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        meter = _train(4, momentum=0.0, updates=300, lags=lags_for(4, 0.0), meter=meters)
    finally:
        done.set()
        reader.join(10)
    assert readings
    assert meter.total_momentum() == pytest.approx(0.75, abs=0.02)


def test_the_server_measures_only_when_asked() -> None:
    coordinator = GroupCoordinator(ModelState(Hyperparameters(0.05)), num_groups=1)
    coordinator.initialize({"w": np.zeros(DIM, np.float32)}, Hyperparameters(0.05))
    worker = coordinator.register()[0]
    rng = np.random.default_rng(0)
    for step in range(1, 61):
        coordinator.push(worker, step, step - 1, 1, {"w": rng.normal(size=DIM).astype(np.float32)})
    assert coordinator.model.version == 60
    assert math.isnan(coordinator.stats().total_momentum)
    assert "--measure-momentum" in server_args(1, 60.0, 30.0, measure_momentum=True)
    assert "--measure-momentum" not in server_args(1, 60.0, 30.0, measure_momentum=False)
