"""Hardware efficiency predicted for numbers of groups never measured, checked against a
simulated cluster."""

import heapq
import random

import pytest

from omnikeras.convergence import HardwareModel, MeasuredHardwareModel
from omnikeras.convergence.saturation import most_groups_worth_having
from omnikeras.profiles import DeviceProfile, batch_shares

FAST = DeviceProfile("/GPU:0", "GPU", (8, 32, 128), (2000.0, 6000.0, 9000.0))
SLOW = DeviceProfile("/CPU:0", "CPU", (8, 32, 128), (300.0, 700.0, 900.0))


def simulate(workers: list[DeviceProfile], groups: int, batch: int, push_pull: float, apply: float, seconds: float = 200.0) -> float:
    """Seconds per update of a simulated cluster: groups compute their members' shares
    (with 10% jitter per step), push, and queue at a server that applies one update at a
    time, in arrival order; each group starts its next step when its update is applied."""
    rng = random.Random(0)
    sharers = {id(d): sum(1 for w in workers if w is d) for d in workers}
    # (time, group): the group's gradients reach the server then; the server takes them
    # in the order they arrive.
    arrivals = []
    for group in range(groups):
        heapq.heappush(arrivals, (_step_seconds(workers, groups, group, batch, sharers, rng) + push_pull, group))
    server_free = 0.0
    updates = 0
    while arrivals:
        arrival, group = heapq.heappop(arrivals)
        if arrival > seconds:
            break
        server_free = max(server_free, arrival) + apply
        updates += 1
        next_arrival = server_free + _step_seconds(workers, groups, group, batch, sharers, rng) + push_pull
        heapq.heappush(arrivals, (next_arrival, group))
    return seconds / updates


def _step_seconds(
    workers: list[DeviceProfile], groups: int, group: int, batch: int, sharers: dict[int, int], rng: random.Random
) -> float:
    members = workers[group::groups]
    shares = batch_shares([d.throughput(batch / len(members)) for d in members], batch)
    return max(s * sharers[id(d)] / d.throughput(s) * rng.uniform(0.9, 1.1) for d, s in zip(members, shares) if s)


@pytest.mark.parametrize(
    "workers",
    [
        [SLOW, SLOW, SLOW, SLOW],
        [FAST, SLOW, FAST, SLOW],
        [FAST, FAST, FAST, FAST, FAST, FAST, FAST, FAST],
    ],
    ids=["shared-cpu", "mixed", "eight-gpus"],
)
def test_profiles_predict_unseen_groups_within_20_percent(workers: list[DeviceProfile]) -> None:
    model = HardwareModel(workers, batch_size=64, push_pull_seconds=0.004, server_seconds_per_update=0.001)
    # One measurement, at g = 1, calibrates the model.
    model.observe(1, simulate(workers, 1, 64, 0.004, 0.001))
    for groups in [g for g in range(2, len(workers) + 1) if len(workers) % g == 0]:
        measured = simulate(workers, groups, 64, 0.004, 0.001)
        assert model.seconds_per_update(groups) == pytest.approx(measured, rel=0.2), groups


def test_measurements_alone_predict_unseen_groups_within_20_percent() -> None:
    workers = [SLOW] * 8
    model = MeasuredHardwareModel(num_workers=8)
    for groups in (1, 8):
        model.observe(groups, simulate(workers, groups, 64, 0.01, 0.0005))
    for groups in (2, 4):
        assert model.seconds_per_update(groups) == pytest.approx(simulate(workers, groups, 64, 0.01, 0.0005), rel=0.2)


def test_a_link_bound_cluster_is_extrapolated_on_its_log_log_slope() -> None:
    # Seconds per update the emulated cpu-cluster-1gbit measured: more groups gain more
    # than in proportion, which a + b / g can only follow down to zero.
    measured = {1: 0.616, 2: 0.2627, 4: 0.1228, 8: 0.0546}
    model = MeasuredHardwareModel(num_workers=8)
    for groups in (1, 2):
        model.observe(groups, measured[groups])
    for groups in (4, 8):
        assert model.seconds_per_update(groups) == pytest.approx(measured[groups], rel=0.2)


def test_the_server_caps_the_update_rate() -> None:
    model = HardwareModel([FAST] * 8, batch_size=8, push_pull_seconds=0.0, server_seconds_per_update=0.05)
    assert model.predict(8) == pytest.approx(0.05)
    # More groups stop paying once the server is busy all the time.
    assert most_groups_worth_having({g: model.predict(g) for g in (1, 2, 4, 8)}, [1, 2, 4, 8]) < 8


def test_the_most_groups_worth_having_is_decided_largest_first() -> None:
    choices = [1, 2, 4, 8]
    assert most_groups_worth_having({8: 1.0, 4: 2.0}, choices) == 8
    assert most_groups_worth_having({8: 1.95, 4: 2.0}, choices) is None
    assert most_groups_worth_having({8: 1.95, 4: 2.0, 2: 2.1, 1: 2.2}, choices) == 1
    assert most_groups_worth_having({8: 1.95, 4: 2.0, 2: 2.5}, choices) == 4
    assert most_groups_worth_having({1: 3.0}, [1]) == 1


def test_observations_report_the_prediction_error() -> None:
    model = HardwareModel([SLOW] * 2, batch_size=32, push_pull_seconds=0.0)
    predicted = model.predict(1)
    assert model.observe(1, predicted * 2) == pytest.approx(-0.5)
    assert model.seconds_per_update(1) == pytest.approx(predicted * 2)


def test_bad_numbers_of_groups_are_refused() -> None:
    with pytest.raises(ValueError, match="num_groups"):
        HardwareModel([SLOW], 32, 0.0).predict(2)
    with pytest.raises(ValueError, match="nothing measured"):
        MeasuredHardwareModel(4).seconds_per_update(2)
