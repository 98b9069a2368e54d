"""The group coordinator in one process: the semantics of group steps, without gRPC."""

import threading
import time

import numpy as np
import pytest

from omnikeras.parameter_server.errors import Aborted, FailedPrecondition, InvalidArgument, NonFinite, NotFound
from omnikeras.parameter_server.groups import GroupCoordinator
from omnikeras.parameter_server.model_state import ModelState
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.parameter_server.values import PushResult


def _coordinator(num_groups: int = 1, timeout: float = 30.0, lr: float = 1.0) -> GroupCoordinator:
    coordinator = GroupCoordinator(ModelState(Hyperparameters(lr)), num_groups, timeout)
    coordinator.initialize({"w": np.zeros(3, np.float32)}, Hyperparameters(lr))
    return coordinator


def _push_async(coordinator: GroupCoordinator, worker: int, step: int, value: float, count: int = 1) -> dict:
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = coordinator.push(worker, step, 0, count, {"w": np.full(3, value, np.float32)})
        except Exception as error:
            outcome["error"] = error

    outcome["thread"] = threading.Thread(target=run)
    outcome["thread"].start()
    return outcome


def _step(result: PushResult) -> tuple[int, int, int]:
    return result.model_version, result.group, result.members_combined


def _weights(coordinator: GroupCoordinator) -> np.ndarray:
    return coordinator.model.weights["w"].copy()


def test_group_of_three_applies_the_count_weighted_mean_once() -> None:
    coordinator = _coordinator()
    workers = [coordinator.register()[0] for _ in range(3)]
    pending = [_push_async(coordinator, w, 1, value, count) for w, value, count in zip(workers, [1.0, 2.0, 4.0], [1, 1, 2])]
    for p in pending:
        p["thread"].join(5)
    assert {_step(p["result"]) for p in pending} == {(1, 0, 3)}
    np.testing.assert_array_equal(_weights(coordinator), np.full(3, -(1 + 2 + 8) / 4))
    assert coordinator.model.version == 1


def test_groups_apply_independently() -> None:
    coordinator = _coordinator(num_groups=2)
    first, second = coordinator.register()[0], coordinator.register()[0]
    assert coordinator.stats().groups[0].members == (first,)
    # Group 1's member has not pushed, yet group 0's step is applied at once.
    result = coordinator.push(first, 1, 0, 1, {"w": np.ones(3, np.float32)})
    assert _step(result) == (1, 0, 1)
    result = coordinator.push(second, 1, 0, 1, {"w": np.ones(3, np.float32)})
    assert _step(result) == (2, 1, 1)
    stats = coordinator.stats()
    assert stats.groups[1].staleness_histogram == {1: 1}
    assert stats.groups[0].staleness_histogram == {0: 1}


def test_a_retried_step_is_not_applied_twice() -> None:
    coordinator = _coordinator()
    worker = coordinator.register()[0]
    first = coordinator.push(worker, 7, 0, 1, {"w": np.ones(3, np.float32)})
    again = coordinator.push(worker, 7, 0, 1, {"w": np.ones(3, np.float32)})
    assert first == again
    np.testing.assert_array_equal(_weights(coordinator), -np.ones(3))
    with pytest.raises(FailedPrecondition, match="older"):
        coordinator.push(worker, 6, 1, 1, {"w": np.ones(3, np.float32)})


def test_a_dead_member_is_dropped_after_the_deadline() -> None:
    coordinator = _coordinator(timeout=0.3)
    alive, dead = coordinator.register()[0], coordinator.register()[0]
    started = time.monotonic()
    result = coordinator.push(alive, 1, 0, 1, {"w": np.ones(3, np.float32)})
    assert 0.3 <= time.monotonic() - started < 5
    assert result.members_combined == 1
    assert coordinator.stats().workers_dropped == 1
    with pytest.raises(FailedPrecondition, match="dropped"):
        coordinator.push(dead, 1, 0, 1, {"w": np.ones(3, np.float32)})
    # The dropped worker may come back, and its group then waits for it again.
    assert coordinator.register(worker_id=dead)[0] == dead
    assert coordinator.stats().groups[0].members == (alive, dead)


def test_deregistering_the_last_missing_member_completes_the_step() -> None:
    coordinator = _coordinator()
    staying, leaving = coordinator.register()[0], coordinator.register()[0]
    pending = _push_async(coordinator, staying, 1, 2.0)
    time.sleep(0.1)
    assert "result" not in pending
    coordinator.deregister(leaving)
    pending["thread"].join(5)
    assert _step(pending["result"]) == (1, 0, 1)


def test_regrouping_applies_partial_steps_first() -> None:
    coordinator = _coordinator()
    workers = [coordinator.register()[0] for _ in range(4)]
    pending = _push_async(coordinator, workers[0], 1, 4.0)
    time.sleep(0.1)
    num_groups, assignment, flushed = coordinator.set_groups(2, {})
    pending["thread"].join(5)
    assert _step(pending["result"]) == (1, 0, 1)
    assert (num_groups, flushed) == (2, 1)
    assert sorted(assignment.values()) == [0, 0, 1, 1]
    np.testing.assert_array_equal(_weights(coordinator), np.full(3, -4.0))


def test_regrouping_validates_before_changing_anything() -> None:
    coordinator = _coordinator()
    worker = coordinator.register()[0]
    with pytest.raises(NotFound):
        coordinator.set_groups(2, {99: 0})
    with pytest.raises(InvalidArgument):
        coordinator.set_groups(2, {worker: 2})
    with pytest.raises(InvalidArgument):
        coordinator.set_groups(-1, {})
    assert coordinator.num_groups == 1


def test_pushes_are_refused_for_unknown_workers_and_future_versions() -> None:
    coordinator = _coordinator()
    with pytest.raises(NotFound, match="unknown worker"):
        coordinator.push(42, 1, 0, 1, {"w": np.ones(3, np.float32)})
    worker = coordinator.register()[0]
    with pytest.raises(InvalidArgument, match="version 5"):
        coordinator.push(worker, 1, 5, 1, {"w": np.ones(3, np.float32)})
    with pytest.raises(InvalidArgument, match="example_count"):
        coordinator.push(worker, 1, 0, 0, {"w": np.ones(3, np.float32)})
    assert coordinator.model.version == 0


def test_pushing_before_the_model_exists_is_refused() -> None:
    coordinator = GroupCoordinator(ModelState(Hyperparameters()))
    worker = coordinator.register()[0]
    with pytest.raises(FailedPrecondition, match="not initialised"):
        coordinator.check_pusher(worker)
    with pytest.raises(FailedPrecondition, match="not initialised"):
        coordinator.wait_for_model(0.05)


def test_snapshots_restore_weights_and_momentum_between_steps() -> None:
    coordinator = GroupCoordinator(ModelState(Hyperparameters(1.0, momentum=0.5)))
    coordinator.initialize({"w": np.zeros(3, np.float32)}, Hyperparameters(1.0, momentum=0.5))
    worker = coordinator.register()[0]
    coordinator.push(worker, 1, 0, 1, {"w": np.ones(3, np.float32)})
    coordinator.save_snapshot("start")
    coordinator.push(worker, 2, 1, 1, {"w": np.ones(3, np.float32)})
    after_two = _weights(coordinator)
    assert coordinator.restore_snapshot("start") == 3
    np.testing.assert_array_equal(_weights(coordinator), -np.ones(3))
    # The momentum buffer came back too: the same push lands where it did the first time.
    coordinator.push(worker, 3, 3, 1, {"w": np.ones(3, np.float32)})
    np.testing.assert_array_equal(_weights(coordinator), after_two)
    with pytest.raises(NotFound, match="no snapshot"):
        coordinator.restore_snapshot("missing")


def test_a_snapshot_puts_back_the_iteration_count_that_adams_bias_corrections_read() -> None:
    rule = Hyperparameters(0.1, momentum=0.9, optimizer="Adam")
    coordinator = GroupCoordinator(ModelState(rule))
    coordinator.initialize({"w": np.zeros(3, np.float32)}, rule)
    worker = coordinator.register()[0]
    coordinator.save_snapshot("start")
    coordinator.push(worker, 1, 0, 1, {"w": np.ones(3, np.float32)})
    first = _weights(coordinator)
    coordinator.push(worker, 2, 1, 1, {"w": np.ones(3, np.float32)})
    coordinator.restore_snapshot("start")
    assert coordinator.model.iterations == 0
    # A fresh Adam's first step again: the rate, not 1 / sqrt(1 - beta_2) times it.
    coordinator.push(worker, 3, 3, 1, {"w": np.ones(3, np.float32)})
    np.testing.assert_allclose(_weights(coordinator), first)
    np.testing.assert_allclose(first, -0.1, rtol=1e-5)


def test_the_layout_version_changes_with_groups_and_members() -> None:
    coordinator = _coordinator(num_groups=2)
    first = coordinator.register()[0]
    layout = coordinator.push(first, 1, 0, 1, {"w": np.ones(3, np.float32)}).layout_version
    second = coordinator.register()[0]
    assert coordinator.push(first, 2, 1, 1, {"w": np.ones(3, np.float32)}).layout_version > layout
    layout = coordinator.push(second, 1, 2, 1, {"w": np.ones(3, np.float32)}).layout_version
    coordinator.set_groups(1, {})
    threads = [_push_async(coordinator, w, 3, 1.0) for w in (first, second)]
    for t in threads:
        t["thread"].join(5)
    assert threads[0]["result"].layout_version > layout


def test_a_push_reply_carries_the_layout_only_when_it_changed_since_the_pusher_knew_it() -> None:
    coordinator = _coordinator(num_groups=2)
    first, second = coordinator.register()[0], coordinator.register()[0]
    result = coordinator.push(first, 1, 0, 1, {"w": np.ones(3, np.float32)})
    assert result.layout is not None
    assert result.layout.groups == ((first,), (second,)) and result.layout.version == result.layout_version
    known = result.layout_version
    assert coordinator.push(first, 2, 1, 1, {"w": np.ones(3, np.float32)}, known_layout=known).layout is None
    coordinator.set_groups(1, {})
    threads = [_push_async(coordinator, w, 3, 1.0) for w in (first, second)]
    for t in threads:
        t["thread"].join(5)
    # (_push_async knows no layout: each reply carries it.)
    assert threads[0]["result"].layout.groups == ((first, second),)
    assert threads[0]["result"].layout.group_of(second) == 0


def _push_batch(coordinator: GroupCoordinator, worker: int, step: int, batch: int, value: float = 1.0) -> PushResult:
    return coordinator.push(worker, step, coordinator.model.version, 1, {"w": np.full(3, value, np.float32)}, batch=batch)


def test_each_group_step_reads_the_next_batch_of_one_sequence() -> None:
    coordinator = _coordinator(num_groups=2)
    first, second = coordinator.register()[0], coordinator.register()[0]
    batch_of = {g.group: g.next_batch for g in coordinator.stats().groups}
    assert sorted(batch_of.values()) == [0, 1]
    read = list(batch_of.values())
    for step in range(1, 4):
        for worker, group in ((first, 0), (second, 1)):
            result = _push_batch(coordinator, worker, step, batch_of[group])
            assert result.members_combined == 1
            batch_of[group] = result.next_batch
            read.append(result.next_batch)
    assert sorted(read) == list(range(8)), "every batch handed out once, none skipped"


def test_a_member_finishing_a_step_of_the_old_layout_is_applied_on_its_own() -> None:
    coordinator = _coordinator(num_groups=2)
    first, second = coordinator.register()[0], coordinator.register()[0]
    old = {g.group: g.next_batch for g in coordinator.stats().groups}
    # One group into two: the steps under way (batches 0 and 1) are the old layout's.
    coordinator.set_groups(1, {first: 0, second: 0})
    (new,) = [g.next_batch for g in coordinator.stats().groups if g.members]
    assert new not in old.values()
    straggler = _push_batch(coordinator, first, 1, old[0])
    assert (straggler.members_combined, straggler.next_batch) == (1, new)
    assert coordinator.model.version == 1, "applied at once, without waiting for the group"
    other = _push_batch(coordinator, second, 1, old[1])
    assert other.members_combined == 1
    # Both now read the new layout's batch, as one group step.
    together = [_push_async_batch(coordinator, w, 2, new) for w in (first, second)]
    for p in together:
        p["thread"].join(5)
    assert {p["result"].members_combined for p in together} == {2}
    assert coordinator.model.version == 3


def _push_async_batch(coordinator: GroupCoordinator, worker: int, step: int, batch: int) -> dict:
    outcome: dict = {}
    version = coordinator.model.version

    def run() -> None:
        outcome["result"] = coordinator.push(worker, step, version, 1, {"w": np.ones(3, np.float32)}, batch=batch)

    outcome["thread"] = threading.Thread(target=run)
    outcome["thread"].start()
    return outcome


def test_a_restarted_server_hands_out_again_the_batches_not_in_its_checkpoint() -> None:
    coordinator = _coordinator(num_groups=2)
    first, _ = coordinator.register()[0], coordinator.register()[0]
    batch_of = {g.group: g.next_batch for g in coordinator.stats().groups}
    _push_batch(coordinator, first, 1, batch_of[0])  # batch 0 done; group 1 still reads batch 1
    state = coordinator.checkpoint_state()
    restarted = GroupCoordinator(ModelState(Hyperparameters(1.0)), 2, 30.0)
    restarted.restore(state)
    restarted.register(first)
    assert [g.next_batch for g in restarted.stats().groups if g.members] == [1]


def test_every_member_of_a_step_is_told_the_same_next_batch_whatever_follows() -> None:
    coordinator = _coordinator(num_groups=1)
    first, second = coordinator.register()[0], coordinator.register()[0]
    (batch,) = [g.next_batch for g in coordinator.stats().groups]
    pending = [_push_async_batch(coordinator, w, 1, batch) for w in (first, second)]
    for p in pending:
        p["thread"].join(5)
    # A regrouping right after the step does not change what its members read next.
    coordinator.set_groups(2, {first: 0, second: 1})
    told = {(p["result"].next_batch, p["result"].next_members) for p in pending}
    assert told == {(batch + 1, (first, second))}
    # They read it as the old layout's step: each share on its own.
    assert _push_batch(coordinator, first, 2, batch + 1).members_combined == 1
    assert _push_batch(coordinator, second, 2, batch + 1).members_combined == 1


def test_a_refused_update_fails_every_member_of_its_step_and_their_retries() -> None:
    coordinator = _coordinator(lr=4.0)
    first, second = coordinator.register()[0], coordinator.register()[0]
    huge = np.finfo(np.float32).max
    waiting = _push_async(coordinator, first, 0, -huge)
    with pytest.raises(NonFinite, match="update"):
        coordinator.push(second, 0, 0, 1, {"w": np.full(3, -huge, np.float32)})
    waiting["thread"].join(10)
    assert isinstance(waiting["error"], NonFinite)
    with pytest.raises(NonFinite):
        coordinator.push(first, 0, 0, 1, {"w": np.ones(3, np.float32)})
    np.testing.assert_array_equal(_weights(coordinator), np.zeros(3, np.float32))
    assert coordinator.model.version == 0
    assert coordinator.stats().pushes_rejected_non_finite == 2
    # The group goes on with its next step.
    waiting = _push_async(coordinator, first, 1, 1.0)
    coordinator.push(second, 1, 0, 1, {"w": np.ones(3, np.float32)})
    waiting["thread"].join(10)
    np.testing.assert_array_equal(_weights(coordinator), np.full(3, -4, np.float32))


def test_a_member_that_skips_its_update_makes_the_group_step_go_on_without_one() -> None:
    coordinator = GroupCoordinator(ModelState(Hyperparameters(1.0)), 1, 30.0)
    hyperparameters = Hyperparameters(1.0, momentum=0.5, statistics=frozenset({"mean"}))
    coordinator.initialize({"w": np.zeros(3, np.float32), "mean": np.zeros(2, np.float32)}, hyperparameters)
    first, second = coordinator.register()[0], coordinator.register()[0]
    (batch,) = [g.next_batch for g in coordinator.stats().groups]

    def push(worker: int, step: int, gradient: float, change: float, skip_update: bool = False) -> PushResult:
        return coordinator.push(
            worker, step, coordinator.model.version, 1,
            {"w": np.full(3, gradient, np.float32), "mean": np.full(2, change, np.float32)},
            batch=batch, skip_update=skip_update,
        )

    results: list[PushResult] = []
    waiting = threading.Thread(target=lambda: results.append(push(first, 1, 1.0, 2.0)))
    waiting.start()
    # The second member's loss scale overflowed: it sends zeros, flagged.
    results.append(push(second, 1, 0.0, 4.0, skip_update=True))
    waiting.join(5)
    assert [(r.update_skipped, r.members_combined, r.next_batch) for r in results] == [(True, 2, batch + 1)] * 2
    # No update, nor any momentum: only the statistics took the members' mean change.
    np.testing.assert_array_equal(_weights(coordinator), np.zeros(3, np.float32))
    assert coordinator.model.slots == {}
    np.testing.assert_array_equal(coordinator.model.weights["mean"], np.full(2, 3.0, np.float32))
    assert (coordinator.model.iterations, coordinator.stats().updates_applied) == (0, 0)
    # The next step, which no member skips, updates as any other.
    batch += 1
    waiting = threading.Thread(target=lambda: results.append(push(first, 2, 1.0, 0.0)))
    waiting.start()
    results.append(push(second, 2, 1.0, 0.0))
    waiting.join(5)
    assert not results[-1].update_skipped and not results[-2].update_skipped
    np.testing.assert_array_equal(_weights(coordinator), np.full(3, -1.0, np.float32))
    assert coordinator.model.iterations == 1


def test_a_training_ends_when_its_last_worker_leaves_with_the_history_its_chief_left() -> None:
    coordinator = _coordinator()
    chief, other = coordinator.register()[0], coordinator.register()[0]
    coordinator.request_stop('{"epoch": [0], "history": {"val_loss": [0.5]}}')
    coordinator.deregister(chief)
    # Still under way while a worker is left.
    assert (coordinator.stats().trainings_ended, coordinator.stats().chief_history) == (0, "")
    coordinator.deregister(other)
    ended = coordinator.stats()
    assert (ended.trainings_ended, ended.chief_history) == (1, '{"epoch": [0], "history": {"val_loss": [0.5]}}')
    # A next training begun at once leaves the count and the History of the one that ended.
    again = coordinator.register()[0]
    assert (coordinator.stats().trainings_ended, coordinator.stats().chief_history) == (1, ended.chief_history)
    # One that ends without its chief's History leaves none.
    coordinator.deregister(again)
    assert (coordinator.stats().trainings_ended, coordinator.stats().chief_history) == (2, "")


def test_set_weights_replaces_the_weights_keeps_the_optimizer_s_state_and_refuses_older_gradients() -> None:
    coordinator = GroupCoordinator(ModelState(Hyperparameters(0.5, momentum=0.9)), 1, 30.0)
    coordinator.initialize({"w": np.zeros(3, np.float32)}, Hyperparameters(0.5, momentum=0.9))
    worker = coordinator.register()[0]
    coordinator.push(worker, 1, 0, 1, {"w": np.ones(3, np.float32)})
    momentum = coordinator.model.slots["w"]["momentum"].copy()
    for bad in ({"v": np.zeros(3, np.float32)}, {"w": np.zeros(4, np.float32)}, {"w": np.zeros(3, np.float64)}):
        with pytest.raises(InvalidArgument):
            coordinator.set_weights(bad)
    assert coordinator.model.version == 1

    assert coordinator.set_weights({"w": np.full(3, 7.0, np.float32)}) == 2
    np.testing.assert_array_equal(_weights(coordinator), np.full(3, 7.0))
    np.testing.assert_array_equal(coordinator.model.slots["w"]["momentum"], momentum)
    assert coordinator.model.iterations == 1
    # A gradient computed on the weights replaced is not applied to the ones put in place.
    with pytest.raises(Aborted):
        coordinator.push(worker, 2, 1, 1, {"w": np.ones(3, np.float32)})
    np.testing.assert_array_equal(_weights(coordinator), np.full(3, 7.0))


def test_replace_model_puts_other_variables_in_place_and_refuses_older_gradients() -> None:
    rule = Hyperparameters(0.5, momentum=0.9)
    coordinator = GroupCoordinator(ModelState(rule), 1, 30.0)
    coordinator.initialize({"w": np.zeros(3, np.float32), "b": np.zeros(2, np.float32)}, rule)
    worker = coordinator.register()[0]
    coordinator.push(worker, 1, 0, 1, {"w": np.ones(3, np.float32), "b": np.ones(2, np.float32)})
    momentum = coordinator.model.slots["w"]["momentum"].copy()
    coordinator.save_snapshot("best")

    # Same optimizer: "w" keeps its state and the iteration count stays; "b" is gone
    # and "v" is new.
    weights = {"w": np.full(3, 7.0, np.float32), "v": np.ones((2, 2), np.float32)}
    assert coordinator.replace_model(weights, rule, fresh_optimizer=False) == 2
    assert coordinator.model.specs.keys() == {"w", "v"}
    np.testing.assert_array_equal(coordinator.model.slots["w"]["momentum"], momentum)
    assert coordinator.model.slots.keys() == {"w"}
    assert coordinator.model.iterations == 1
    with pytest.raises(NotFound):
        coordinator.restore_snapshot("best")  # of the variables replaced
    with pytest.raises(Aborted):
        coordinator.push(worker, 2, 1, 1, {"w": np.ones(3, np.float32), "b": np.ones(2, np.float32)})
    with pytest.raises(InvalidArgument, match="not of the model's variables"):
        coordinator.push(worker, 3, 2, 1, {"w": np.ones(3, np.float32), "b": np.ones(2, np.float32)})
    coordinator.push(worker, 4, 2, 1, {"w": np.ones(3, np.float32), "v": np.ones((2, 2), np.float32)})
    np.testing.assert_allclose(coordinator.model.weights["v"], np.full((2, 2), 0.5))

    # A fresh optimizer (a recompiled model) starts without state, at iteration 0.
    assert coordinator.replace_model({"w": np.zeros(3, np.float32)}, Hyperparameters(0.1), fresh_optimizer=True) == 4
    assert coordinator.model.slots == {} and coordinator.model.iterations == 0
    assert coordinator.hyperparameters().learning_rate == 0.1


def _rate_from_workers(num_groups: int = 1) -> GroupCoordinator:
    rule = Hyperparameters(0.5, compensate_asynchrony=False, learning_rate_from_workers=True)
    coordinator = GroupCoordinator(ModelState(rule), num_groups, 30.0)
    coordinator.initialize({"w": np.zeros(3, np.float32)}, rule)
    return coordinator


def test_where_the_workers_evaluate_the_rate_a_group_step_applies_its_members_mean() -> None:
    coordinator = _rate_from_workers()
    workers = [coordinator.register()[0] for _ in range(2)]
    pending = [
        threading.Thread(
            target=coordinator.push,
            args=(w, 1, 0, count, {"w": np.ones(3, np.float32)}),
            kwargs={"learning_rate": rate},
        )
        for w, rate, count in zip(workers, [0.1, 0.4], [3, 1])
    ]
    for thread in pending:
        thread.start()
    for thread in pending:
        thread.join(5)
    # The rates weighted by example count: (3 x 0.1 + 0.4) / 4.
    np.testing.assert_allclose(_weights(coordinator), np.full(3, -0.175), rtol=1e-6)
    assert coordinator.stats().learning_rate_in_force == pytest.approx(0.175)


def test_a_pushed_rate_follows_the_iterations_the_reply_carries() -> None:
    coordinator = _rate_from_workers()
    worker = coordinator.register()[0]
    # Before any push the rule's rate reports; the worker's rate applies from its push.
    assert coordinator.stats().learning_rate_in_force == 0.5
    first = coordinator.push(worker, 1, 0, 1, {"w": np.ones(3, np.float32)}, learning_rate=0.0)
    np.testing.assert_array_equal(_weights(coordinator), np.zeros(3))
    second = coordinator.push(worker, 2, 1, 1, {"w": np.ones(3, np.float32)}, learning_rate=0.25)
    np.testing.assert_allclose(_weights(coordinator), np.full(3, -0.25))
    assert (first.iterations, second.iterations) == (1, 2)
    # A new rule's rate is in force until the next push.
    coordinator.set_hyperparameters(Hyperparameters(0.3, compensate_asynchrony=False, learning_rate_from_workers=True))
    assert coordinator.stats().learning_rate_in_force == 0.3


def test_a_pushed_rate_is_ignored_where_the_server_evaluates_the_rate() -> None:
    coordinator = _coordinator(lr=1.0)
    worker = coordinator.register()[0]
    coordinator.push(worker, 1, 0, 1, {"w": np.ones(3, np.float32)}, learning_rate=0.01)
    np.testing.assert_array_equal(_weights(coordinator), -np.ones(3))


@pytest.mark.parametrize("rate", [float("nan"), float("inf"), -0.1])
def test_a_pushed_rate_that_is_not_finite_or_negative_is_refused(rate: float) -> None:
    coordinator = _rate_from_workers()
    worker = coordinator.register()[0]
    with pytest.raises(InvalidArgument, match="learning_rate"):
        coordinator.push(worker, 1, 0, 1, {"w": np.ones(3, np.float32)}, learning_rate=rate)
    assert coordinator.model.version == 0
    # The refused push took no step: the worker pushes it again.
    coordinator.push(worker, 1, 0, 1, {"w": np.ones(3, np.float32)}, learning_rate=0.5)
    np.testing.assert_allclose(_weights(coordinator), np.full(3, -0.5))


def test_the_stats_carry_the_chiefs_latest_batch_and_its_request_to_stop() -> None:
    coordinator = _coordinator(num_groups=2)
    chief, other = coordinator.register(chief=True)[0], coordinator.register()[0]
    batch_of = {g.group: g.next_batch for g in coordinator.stats().groups}
    group_of = {w: g.group for g in coordinator.stats().groups for w in g.members}
    assert coordinator.stats().chief_batch == -1
    _push_batch(coordinator, other, 1, batch_of[group_of[other]])
    assert coordinator.stats().chief_batch == -1, "only the chief's pushes count"
    _push_batch(coordinator, chief, 1, batch_of[group_of[chief]])
    assert coordinator.stats().chief_batch == batch_of[group_of[chief]]
    coordinator.request_stop()
    assert coordinator.stats().stop_requested
    # Registering again (a restarted chief) starts its count afresh.
    coordinator.register(chief, chief=True)
    assert coordinator.stats().chief_batch == -1
    coordinator.deregister(chief)
    coordinator.deregister(other)
    stats = coordinator.stats()
    assert (stats.chief_batch, stats.stop_requested, stats.trainings_ended) == (-1, False, 1)
