"""Compute groups: synchronous inside a group, asynchronous across groups.

Every registered worker belongs to one of `num_groups` groups. A group step collects one
gradient from each live member; when the last one arrives, their mean weighted by example
count is applied as ONE update. Groups do not wait for each other. A member that misses the
group deadline is dropped, so a dead worker never blocks its group for longer than that.

The coordinator also hands out the training batches: each group step reads the next batch
in one sequence shared by all groups, so that every batch is read once however the groups
are laid out, also across a regrouping.
"""

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from omnikeras.parameter_server import tensors
from omnikeras.parameter_server.compensation import AsynchronyCompensation, Guards, InForce, effective_step
from omnikeras.parameter_server.errors import (
    Aborted,
    Dropped,
    FailedPrecondition,
    InvalidArgument,
    NonFinite,
    NotFound,
    NotRegistered,
    ResourceExhausted,
    shown,
)
from omnikeras.parameter_server.model_state import ModelState
from omnikeras.parameter_server.momentum_meter import MomentumMeter, lags_for
from omnikeras.parameter_server.optimizers import Step
from omnikeras.parameter_server.server_state import Arrays, OptimizerState, ServerState
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.parameter_server.values import GroupLayout, GroupStats, PushResult, Stats

# How often a waiting call wakes up to see whether its caller went away.
_POLL_SECONDS = 0.5
# Bounds on what a caller may make the server hold. Worker ids stay far from int64's
# limit, so that every id the server hands out fits its replies.
MAX_WORKER_ID = 2**31 - 1
# Workers registered at once, and calls waiting for the model at once: each holds a
# thread of the server while it waits.
MAX_WORKERS = 512
MAX_WAITING_FOR_MODEL = 512
MAX_GROUPS = 1024
MAX_SNAPSHOTS = 16


@dataclass
class _Contribution:
    gradients: dict[str, np.ndarray]
    example_count: int
    computed_at: int
    # Each gradient's sum of magnitudes, or their sum where the caller measured only that.
    magnitudes: Mapping[str, float] | float
    # The training loss of its examples, when the worker knows it.
    loss: float | None = None
    # Its loss scale overflowed: the group step updates no weight (see `push`).
    skip_update: bool = False
    # The learning rate its worker evaluated (`Hyperparameters.learning_rate_from_workers`).
    learning_rate: float | None = None


@dataclass
class _GroupStep:
    deadline: float
    contributions: dict[int, _Contribution] = field(default_factory=dict)
    result: PushResult | None = None
    # Set instead of `result` when the step's update was refused.
    refusal: NonFinite | None = None


@dataclass
class _Worker:
    group: int
    host: str
    chief: bool = False
    last_step: int = -1
    # What its last push got: a retry of that push gets the same.
    last_result: PushResult | NonFinite | None = None


class GroupCoordinator:
    """Owns the model state and the group membership; every method is thread-safe."""

    def __init__(
        self, model: ModelState, num_groups: int = 1, group_timeout: float = 60.0, measure_momentum: bool = False
    ) -> None:
        _check_groups(num_groups)
        if group_timeout <= 0:
            raise InvalidArgument(f"group_timeout must be positive, got {group_timeout}")
        self.model = model
        self.num_groups = num_groups
        self.group_timeout = group_timeout
        self._cond = threading.Condition()
        self._workers: dict[int, _Worker] = {}
        # Every worker id ever placed -> its group; kept across restarts so a worker that
        # re-registers returns to its group.
        self._assignment: dict[int, int] = {}
        self._dropped: set[int] = set()
        self._pending: dict[int, _GroupStep] = {}
        self._next_worker_id = 1
        self._updates: collections.Counter[int] = collections.Counter()
        self._staleness: dict[int, collections.Counter[int]] = collections.defaultdict(
            collections.Counter
        )
        self._pushes_received = 0
        self._rejected_non_finite = 0
        self._workers_dropped = 0
        self._stop_requested = False
        self._final_weights_set = False
        self._chief_batch = -1
        # Trainings that ended (the last worker left), and the History the chief of the
        # last one handed over (`request_stop`); the one under way's, until it ends.
        self._trainings_ended = 0
        self._chief_history = ""
        self._frozen_weights: dict[str, np.ndarray] = {}
        self._history_under_way = ""
        self._layout_version = 0
        # Gradients computed before this version belong to weights a restore replaced.
        self._restored_at = 0
        self._snapshots: dict[str, Arrays] = {}
        # What compensation's step guards had learned when each snapshot was saved, so that
        # every restore of one (each of the tuner's trials) starts from the same caps. Kept
        # in memory only: a restarted server's compensation starts afresh anyway.
        self._snapshot_guards: dict[str, Guards] = {}
        # The iteration count at each snapshot, put back with the optimizer's state: Adam's
        # bias corrections read it, and a fresh state under a later count takes steps up to
        # 1 / sqrt(1 - beta_2) times the rate. In memory only: a snapshot restored after a
        # restart from a checkpoint keeps the server's count.
        self._snapshot_iterations: dict[str, int] = {}
        # Sampling every update costs the update path tens of microseconds: on request.
        self.measure_momentum = measure_momentum
        # Made at the first update after a change of layout, momentum or weights.
        self._meter: MomentumMeter | None = None
        self._compensation = AsynchronyCompensation(num_groups)
        # Batches handed out so far, and the one each group reads at its current step,
        # with the members that share it.
        self._batches_handed_out = 0
        self._batch_of_group: dict[int, tuple[int, tuple[int, ...]]] = {}
        # The checkpoint's version when the server resumed from one; -1 otherwise.
        self.resumed_from_version = -1
        self._waiting_for_model = 0
        # The last rate the workers pushed, where they evaluate it; until one comes, the
        # rule's (which the chief evaluated as training began).
        self._pushed_rate: float | None = None

    # Membership ---------------------------------------------------------------------------

    def register(self, worker_id: int = 0, group: int = -1, host: str = "", chief: bool = False) -> tuple[int, int]:
        """Places a worker in a group (its own again where it re-registers); returns its id
        and group. A `chief` registering starts `chief_batch` afresh (see `push`)."""
        with self._cond:
            if not 0 <= worker_id <= MAX_WORKER_ID:
                raise InvalidArgument(f"worker_id must lie in [0, {MAX_WORKER_ID}], got {worker_id}")
            if worker_id == 0 and self._next_worker_id > MAX_WORKER_ID:
                raise ResourceExhausted("every worker id has been handed out")
            if worker_id not in self._workers and len(self._workers) >= MAX_WORKERS:
                raise ResourceExhausted(f"the server holds {MAX_WORKERS} registered workers at most")
            if group >= self.num_groups or group < -1:
                raise InvalidArgument(f"group {group} is not in [0, {self.num_groups})")
            if worker_id == 0:
                worker_id = self._next_worker_id
            self._next_worker_id = max(self._next_worker_id, worker_id + 1)
            if worker_id in self._workers:
                # A worker that re-registers (after a restart of its own) leaves its group
                # step first, so it is not counted twice.
                self._remove(worker_id)
            if group == -1:
                previous = self._assignment.get(worker_id, -1)
                group = previous if 0 <= previous < self.num_groups else self._smallest_group()
            self._workers[worker_id] = _Worker(group=group, host=host, chief=chief)
            if chief:
                self._chief_batch = -1
            self._assignment[worker_id] = group
            self._dropped.discard(worker_id)
            if group in self._batch_of_group and group not in self._pending:
                # No member has pushed for the group's batch yet (as training starts, none
                # has read it either): the newcomer shares it.
                batch, _ = self._batch_of_group[group]
                self._batch_of_group[group] = (batch, tuple(sorted(self._members(group))))
            self._layout_version += 1
            return worker_id, group

    def deregister(self, worker_id: int) -> None:
        with self._cond:
            self._worker(worker_id)
            self._remove(worker_id)

    def request_stop(self, chief_history: str = "") -> None:
        """Tells every worker, in its next push result, that training is over; cleared
        once no worker is left. `chief_history` is the chief's History as JSON, which
        `stats` hands to the workers once this training has ended (the last one left)."""
        with self._cond:
            self._stop_requested = bool(self._workers)
            self._history_under_way = chief_history

    def set_groups(self, num_groups: int, assignment: Mapping[int, int]) -> tuple[int, dict[int, int], int]:
        """Regroups between group steps: partial steps are applied first, so none is lost.

        Returns the number of groups, the full assignment and how many partial steps were
        applied.
        """
        with self._cond:
            num_groups = num_groups or self.num_groups
            _check_groups(num_groups)
            for worker_id, group in assignment.items():
                self._worker(worker_id)
                if not 0 <= group < num_groups:
                    raise InvalidArgument(f"worker {worker_id}: group {group} is not in [0, {num_groups})")
            flushed = 0
            for group in list(self._pending):
                self._complete(group)
                flushed += 1
            self.num_groups = num_groups
            for worker_id, group in assignment.items():
                self._workers[worker_id].group = group
            sizes = collections.Counter(assignment.values())
            for worker_id in sorted(self._workers.keys() - assignment.keys()):
                group = min(range(num_groups), key=lambda g: (sizes[g], g))
                sizes[group] += 1
                self._workers[worker_id].group = group
            self._assignment.update({w: worker.group for w, worker in self._workers.items()})
            # The steps under way belong to the old layout: their members finish them as
            # steps of their own, and the new groups read new batches, handed out as each
            # first needs one.
            self._batch_of_group.clear()
            self._layout_version += 1
            self._meter = None
            self._compensation.regroup(num_groups)
            return num_groups, {w: worker.group for w, worker in self._workers.items()}, flushed

    # Model --------------------------------------------------------------------------------

    def initialize(self, weights: Mapping[str, np.ndarray], hyperparameters: Hyperparameters) -> bool:
        """Sets the initial weights unless another caller (or a checkpoint) did first."""
        with self._cond:
            if self.model.initialized:
                return False
            # The rule first: the weights are checked against it.
            self.model.hyperparameters = hyperparameters
            self.model.initialize(weights)
            self._cond.notify_all()
            return True

    def wait_for_model(self, timeout: float, caller_gone: Callable[[], bool] = lambda: False) -> None:
        """Waits up to `timeout` seconds for the model, or until the caller goes away."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if self.model.initialized:
                return
            if self._waiting_for_model >= MAX_WAITING_FOR_MODEL:
                raise ResourceExhausted(f"{MAX_WAITING_FOR_MODEL} calls are waiting for the model already")
            self._waiting_for_model += 1
            try:
                while not self.model.initialized:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self.model.require_initialized()
                    self._cond.wait(min(remaining, _POLL_SECONDS))
                    if not self.model.initialized and caller_gone():
                        raise FailedPrecondition("the caller went away while waiting for the model")
            finally:
                self._waiting_for_model -= 1

    def set_hyperparameters(self, hyperparameters: Hyperparameters, fresh_optimizer: bool = False) -> None:
        """A new rule; with `fresh_optimizer`, its optimizer starts afresh (see
        `ModelState.restart_optimizer`)."""
        with self._cond:
            before = self.model.hyperparameters
            if (
                fresh_optimizer
                or hyperparameters.momentum != before.momentum
                or hyperparameters.statistics != before.statistics
            ):
                self._meter = None
            self.model.hyperparameters = hyperparameters
            # The new rule's rate is in force until a worker pushes one.
            self._pushed_rate = None
            if fresh_optimizer:
                self.model.restart_optimizer()

    def hyperparameters(self) -> Hyperparameters:
        with self._cond:
            return self.model.hyperparameters

    def weights_newer_than(self, version: int) -> tuple[int, Iterable[bytes] | None]:
        """The current version and its serialized weight chunks, or None if `version` is
        current."""
        with self._cond:
            self.model.require_initialized()
            if version >= self.model.version:
                return self.model.version, None
            return self.model.version, self.model.weight_chunks()

    def copy_weights(self, out: Mapping[str, np.ndarray]) -> int:
        """Copies the current weights into `out` (arrays of the model's specs, by name) and
        returns their version; no group step changes them halfway."""
        with self._cond:
            self.model.require_initialized()
            self.model.copy_weights_into(out)
            return self.model.version

    def count_rejected_non_finite(self) -> None:
        with self._cond:
            self._pushes_received += 1
            self._rejected_non_finite += 1

    # Group steps --------------------------------------------------------------------------

    def check_pusher(self, worker_id: int) -> None:
        """Fails fast, before a gradient is read, for a caller that may not push."""
        with self._cond:
            self._worker(worker_id)
            self.model.require_initialized()

    def push(
        self,
        worker_id: int,
        step: int,
        computed_at: int,
        example_count: int,
        gradients: dict[str, np.ndarray],
        caller_gone: Callable[[], bool] = lambda: False,
        batch: int | None = None,
        known_layout: int = 0,
        magnitudes: Mapping[str, float] | float | None = None,
        loss: float | None = None,
        skip_update: bool = False,
        learning_rate: float | None = None,
    ) -> PushResult:
        """Adds one member's gradient to its group step and waits until that step is applied.

        A push whose step this worker already pushed (a retry) is not applied again: it gets
        the result of the step that took it. A gradient of a `batch` that is not the group's
        current one (computed in the layout before a regrouping) is applied on its own.
        The result carries the group layout when it changed since `known_layout`, the
        layout version the pusher last saw. `magnitudes`, each gradient's sum of
        magnitudes as the caller's finiteness check measured it (or their sum, where it
        measured them in one pass), spare the update guard a pass over the gradients (see
        `ModelState.apply`); they are measured here when not given. They and `loss`, the
        training loss of the gradient's examples, guard the step of compensated
        asynchrony.

        With `skip_update` (the member's loss scale overflowed), the group step updates no
        weight, as Keras skips a step when any replica's gradients overflow: only the
        statistics take the members' changes, which their forward passes made anyway.
        The step completes as any other, and its members read the next batch.

        `learning_rate` is the rate the worker evaluated for this step, where the rule
        leaves the rate to the workers (`Hyperparameters.learning_rate_from_workers`): the
        group step applies its members' mean, weighted by example count. Ignored
        otherwise.
        """
        if example_count <= 0:
            raise InvalidArgument(f"example_count must be positive, got {example_count}")
        if learning_rate is not None and not (math.isfinite(learning_rate) and learning_rate >= 0):
            raise InvalidArgument(f"a pushed learning_rate must be finite and 0 or more, got {learning_rate}")
        if step < 0:
            raise InvalidArgument(f"step must be 0 or positive, got {step}")
        with self._cond:
            worker = self._worker(worker_id)
            self.model.require_initialized()
            if computed_at > self.model.version or computed_at < 0:
                raise InvalidArgument(
                    f"gradient computed at version {computed_at}; the server is at {self.model.version}"
                )
            self._pushes_received += 1
            if computed_at < self._restored_at:
                raise Aborted(
                    f"gradient computed at version {computed_at}, before the weights were "
                    f"restored at version {self._restored_at}: pull and compute again"
                )
            if step <= worker.last_step:
                return self._reply(known_layout, self._duplicate(worker_id, worker, step, caller_gone))
            if gradients.keys() != self.model.specs.keys():
                # A shared-memory segment laid out for variables the model replaced since.
                raise InvalidArgument("the gradients are not of the model's variables: describe the model again")
            group = worker.group
            if magnitudes is None:
                magnitudes = {name: tensors.abs_sum(gradient) for name, gradient in gradients.items()}
            contribution = _Contribution(
                gradients, example_count, computed_at, magnitudes, loss, skip_update, learning_rate
            )
            worker.last_step = step
            if worker.chief and batch is not None:
                # As it arrives: the others in the chief's group wait for it to begin a pass.
                self._chief_batch = max(self._chief_batch, batch)
            if batch is not None and batch != self._batch(group)[0]:
                try:
                    result = self._next(self._apply(group, [contribution]), group)
                except NonFinite as refusal:
                    worker.last_result = refusal
                    self._rejected_non_finite += 1
                    raise
                worker.last_result = result
                return self._reply(known_layout, result)
            pending = self._pending.get(group)
            if pending is None:
                pending = self._pending[group] = _GroupStep(time.monotonic() + self.group_timeout)
            pending.contributions[worker_id] = contribution
            if self._members(group) <= pending.contributions.keys():
                self._complete(group)
            return self._reply(known_layout, self._wait(pending, group, caller_gone))

    def _reply(self, known_layout: int, result: PushResult) -> PushResult:
        """`result` as of now: whether training is over, and the layout, if it changed
        since the pusher's `known_layout`."""
        layout = None
        if known_layout != self._layout_version:
            members: list[list[int]] = [[] for _ in range(self.num_groups)]
            for worker_id, worker in sorted(self._workers.items()):
                members[worker.group].append(worker_id)
            layout = GroupLayout(self._layout_version, tuple(tuple(m) for m in members))
        elif result.layout is None and (result.stop_requested, result.layout_version) == (
            self._stop_requested,
            self._layout_version,
        ):
            # As of now already (`_next` made it so): the common case, with no copy.
            return result
        return dataclasses.replace(
            result, stop_requested=self._stop_requested, layout_version=self._layout_version, layout=layout
        )

    def _next(self, result: PushResult, group: int) -> PushResult:
        """`result` naming the batch `group` reads next, as of now (see `_reply`)."""
        batch, members = self._batch(group)
        return dataclasses.replace(
            result,
            next_batch=batch,
            next_members=members,
            stop_requested=self._stop_requested,
            layout_version=self._layout_version,
        )

    def _batch(self, group: int) -> tuple[int, tuple[int, ...]]:
        """The batch `group` reads at its current step and the members that share it,
        handed out now if it has none."""
        if group not in self._batch_of_group:
            self._batch_of_group[group] = (self._batches_handed_out, tuple(sorted(self._members(group))))
            self._batches_handed_out += 1
        return self._batch_of_group[group]

    def _duplicate(
        self, worker_id: int, worker: _Worker, step: int, caller_gone: Callable[[], bool]
    ) -> PushResult:
        if step != worker.last_step:
            raise FailedPrecondition(
                f"worker {worker_id}: step {step} is older than its last push (step {worker.last_step})"
            )
        pending = self._pending.get(worker.group)
        if pending is not None and worker_id in pending.contributions:
            return self._wait(pending, worker.group, caller_gone)
        if isinstance(worker.last_result, NonFinite):
            raise worker.last_result
        assert worker.last_result is not None
        return worker.last_result

    def _wait(self, pending: _GroupStep, group: int, caller_gone: Callable[[], bool]) -> PushResult:
        while pending.result is None and pending.refusal is None:
            remaining = pending.deadline - time.monotonic()
            if remaining <= 0:
                self._drop_missing(group, pending)
                self._complete(group)
                break
            self._cond.wait(min(remaining, _POLL_SECONDS))
            if pending.result is None and pending.refusal is None and caller_gone():
                raise FailedPrecondition("the caller went away while its group step was pending")
        if pending.refusal is not None:
            raise pending.refusal
        assert pending.result is not None
        return pending.result

    def _complete(self, group: int) -> None:
        """Applies the group's step, and hands out the batch of its next: every member
        of this step reads that one next, whatever the layout by then. A refused update
        changes nothing: its members read the same batch again."""
        step = self._pending.pop(group)
        try:
            applied = self._apply(group, list(step.contributions.values()))
        except NonFinite as refusal:
            step.refusal = refusal
            self._rejected_non_finite += len(step.contributions)
        else:
            self._batch_of_group.pop(group, None)
            step.result = self._next(applied, group)
        for worker_id in step.contributions:
            if worker_id in self._workers:
                self._workers[worker_id].last_result = step.result or step.refusal
        self._cond.notify_all()

    def _apply(self, group: int, contributions: list[_Contribution]) -> PushResult:
        ages = [self.model.version - c.computed_at for c in contributions]
        kept = [self._kept(age) for age in ages]
        if any(c.skip_update for c in contributions):
            return self._skip(group, contributions, kept)
        pushed_rate = _pushed_rate(contributions)
        if pushed_rate is not None:
            self._pushed_rate = pushed_rate
        rule = self._rule_in_force()
        updates = self.model.updates
        magnitudes = _weighted_magnitudes(contributions, kept)
        if self.model.hyperparameters.compensate_asynchrony:
            share = self._compensation.share(tensors.total_magnitude(magnitudes))
            if share != 1.0:
                rule = dataclasses.replace(rule, learning_rate=rule.learning_rate * share)
        if self.measure_momentum:
            self._apply_measured(contributions, rule, kept, magnitudes)
        else:
            self.model.apply(_weighted_mean(contributions, kept), magnitudes, rule.learning_rate, rule.momentum)
        # Each gradient's own staleness, by its share: the lag at which its weight lands.
        examples = sum(c.example_count for c in contributions)
        self._compensation.record(
            sum(c.example_count * age for c, age in zip(contributions, ages)) / examples, _weighted_loss(contributions)
        )
        # A step that only accumulated its gradients (Keras' gradient accumulation) is none.
        self._updates[group] += self.model.updates - updates
        self._staleness[group][max(ages)] += 1
        return PushResult(self.model.version, group, len(contributions), iterations=self.model.iterations)

    def _skip(self, group: int, contributions: list[_Contribution], kept: list[float]) -> PushResult:
        """A group step that a member skipped: the statistics take the members' changes,
        the other weights stay, and neither the iterations nor compensation's measures
        count it (as Keras counts no skipped step)."""
        statistics = self.model.hyperparameters.statistics
        for contribution in contributions:
            contribution.gradients = {n: g for n, g in contribution.gradients.items() if n in statistics}
        self.model.add_statistics(_weighted_mean(contributions, kept))
        return PushResult(
            self.model.version, group, len(contributions), update_skipped=True, iterations=self.model.iterations
        )

    def _rule_in_force(self) -> InForce:
        """The learning rate and momentum the next update applies."""
        rule = self.model.hyperparameters
        learning_rate = self._compiled_rate()
        if not rule.compensate_asynchrony:
            return InForce(learning_rate, rule.momentum, self._compensation.implicit_momentum)
        return self._compensation.in_force(learning_rate, rule.momentum, rule.rule.momentum_form)

    def _compiled_rate(self) -> float:
        """The learning rate as compiled, before compensation: the schedule's at the
        server's iteration count, or where the workers evaluate it, the one they pushed
        last."""
        rule = self.model.hyperparameters
        if not rule.learning_rate_from_workers:
            return rule.learning_rate_at(self.model.iterations)
        return rule.learning_rate if self._pushed_rate is None else self._pushed_rate

    def _kept(self, staleness: int) -> float:
        """The share of its weight a gradient `staleness` updates old keeps."""
        if not self.model.hyperparameters.compensate_asynchrony:
            return 1.0
        return self._compensation.weight_of(staleness)

    def _apply_measured(
        self,
        contributions: list[_Contribution],
        rule: InForce,
        kept: list[float],
        magnitudes: dict[str, float] | float,
    ) -> None:
        meter = self._momentum_meter()
        # Sampled before the combination, which reuses the gradients' buffers.
        examples = sum(c.example_count for c in contributions)
        gradients = [(c.computed_at, meter.sample(c.gradients), c.example_count / examples) for c in contributions]
        self.model.apply(_weighted_mean(contributions, kept), magnitudes, rule.learning_rate, rule.momentum)
        meter.record(self.model.version - 1, gradients, self._applied_rate(meter, rule), self.model.weights)

    def _applied_rate(self, meter: MomentumMeter, rule: InForce) -> np.ndarray:
        """The rate the update just applied moved each of the meter's coordinates at, from
        its variable's optimizer and state after the update."""
        hyperparameters = self.model.hyperparameters
        # `apply` has counted the update already.
        step = Step(rule.learning_rate, rule.momentum, self.model.iterations - 1)
        rates: dict[str, float | np.ndarray] = {}
        for name in meter.variables:
            optimizer = hyperparameters.optimizer_of(name)
            slots = self.model.slots.get(name, {})
            sampled = {slot: meter.sample_of(name, slots[slot]) for slot in optimizer.rate_slots()}
            rates[name] = optimizer.applied_rate(step, sampled)
        return meter.joined(rates)

    def _momentum_meter(self) -> MomentumMeter:
        """The meter of the updates since the last change of layout, momentum, statistics
        or weights."""
        if self._meter is None:
            rule = self.model.hyperparameters
            # Statistics take the changes pushed, not an optimizer's step of gradients:
            # nothing in them to resolve, and no optimizer state to say their rate.
            trained = {name: weight for name, weight in self.model.weights.items() if name not in rule.statistics}
            self._meter = MomentumMeter(trained, lags=lags_for(self.num_groups, rule.momentum))
        return self._meter

    def _drop_missing(self, group: int, pending: _GroupStep) -> None:
        for worker_id in self._members(group) - pending.contributions.keys():
            del self._workers[worker_id]
            self._dropped.add(worker_id)
            self._workers_dropped += 1
        self._after_leaving()
        self._layout_version += 1

    def _after_leaving(self) -> None:
        if self._workers:
            return
        # The last worker left: this training is over, with the History its chief left,
        # and the weights it chose or, under Keras' `use_ema`, their averages.
        if not self._final_weights_set:
            self.model.finalize_averages()
        self._final_weights_set = False
        self._stop_requested = False
        self._chief_batch = -1
        self._trainings_ended += 1
        self._chief_history, self._history_under_way = self._history_under_way, ""

    def _remove(self, worker_id: int) -> None:
        group = self._workers.pop(worker_id).group
        self._after_leaving()
        self._layout_version += 1
        pending = self._pending.get(group)
        if pending is None:
            return
        # A gradient it already pushed stays in the step; the others no longer wait for it.
        if pending.contributions and self._members(group) <= pending.contributions.keys():
            self._complete(group)

    def _members(self, group: int) -> set[int]:
        return {w for w, worker in self._workers.items() if worker.group == group}

    def _smallest_group(self) -> int:
        sizes = collections.Counter(worker.group for worker in self._workers.values())
        return min(range(self.num_groups), key=lambda g: (sizes[g], g))

    def _worker(self, worker_id: int) -> _Worker:
        worker = self._workers.get(worker_id)
        if worker is not None:
            return worker
        if worker_id in self._dropped:
            raise Dropped(
                f"worker {worker_id} was dropped from its group after missing the group "
                "deadline; register again"
            )
        raise NotRegistered(f"unknown worker {worker_id}: register first")

    # Snapshots ----------------------------------------------------------------------------

    def save_snapshot(self, name: str) -> int:
        with self._cond:
            self.model.require_initialized()
            if not 0 < len(name) <= 128:
                raise InvalidArgument("a snapshot's name has 1 to 128 characters")
            if name not in self._snapshots and len(self._snapshots) >= MAX_SNAPSHOTS:
                raise ResourceExhausted(
                    f"the server keeps {MAX_SNAPSHOTS} snapshots at most: save under a name in use "
                    f"({sorted(self._snapshots)})"
                )
            self._snapshots[name] = self.model.snapshot()
            self._snapshot_guards[name] = self._compensation.guards()
            self._snapshot_iterations[name] = self.model.iterations
            return self.model.version

    def delete_snapshot(self, name: str) -> int:
        with self._cond:
            if self._snapshots.pop(name, None) is None:
                raise NotFound(f"no snapshot named {shown(name)}; saved: {sorted(self._snapshots)}")
            self._snapshot_guards.pop(name, None)
            self._snapshot_iterations.pop(name, None)
            return self.model.version

    def set_weights(self, weights: dict[str, np.ndarray]) -> int:
        """Puts `weights` (every variable, with its dtype and shape) in place of the
        model's between group steps, keeping the optimizer's state and iteration count;
        returns the new version. Partial steps are applied first."""
        with self._cond:
            self.model.require_initialized()
            specs = self.model.specs
            if weights.keys() != specs.keys():
                missing, unknown = sorted(specs.keys() - weights.keys()), sorted(weights.keys() - specs.keys())
                raise InvalidArgument(f"weights must name every variable: missing {missing}, unknown {unknown}")
            for name, weight in weights.items():
                if tensors.VariableSpec.of(name, weight) != specs[name]:
                    raise InvalidArgument(
                        f"variable {shown(name)}: got {weight.dtype.name}{list(weight.shape)}, "
                        f"expected {specs[name].dtype.name}{list(specs[name].shape)}"
                    )
            # Set as a training ends, they are its final weights (see `_after_leaving`).
            self._final_weights_set = self._stop_requested
            return self._replace(weights, self.model.slots, self.model.iterations)

    def set_frozen_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Holds a model's frozen weights (its non-trainable weights other than the
        statistics: a frozen layer's), in place of those held. No update changes them:
        they are kept for the workers whose own were initialised otherwise, and for a
        restart."""
        with self._cond:
            self._frozen_weights = weights

    def frozen_weights(self) -> dict[str, np.ndarray]:
        """The frozen weights last set (never changed in place: not a copy)."""
        with self._cond:
            return self._frozen_weights

    def replace_model(self, weights: dict[str, np.ndarray], hyperparameters: Hyperparameters, fresh_optimizer: bool) -> int:
        """Puts other variables in place of the model's, between group steps (partial
        steps are applied first), under `hyperparameters`; returns the new version. With
        `fresh_optimizer` the optimizer starts afresh, else the variables kept keep their
        state (see `ModelState.replace`). The snapshots, of the variables replaced, are
        dropped."""
        with self._cond:
            self.model.require_initialized()
            for group in list(self._pending):
                self._complete(group)
            self.model.replace(weights, hyperparameters, self.model.version + 1, fresh_optimizer)
            self._snapshots.clear()
            self._snapshot_guards.clear()
            self._snapshot_iterations.clear()
            return self._replaced()

    def restore_snapshot(self, name: str) -> int:
        """Puts a snapshot back between group steps; partial steps are applied first."""
        with self._cond:
            if name not in self._snapshots:
                raise NotFound(f"no snapshot named {shown(name)}; saved: {sorted(self._snapshots)}")
            weights, slots = self._snapshots[name]
            # Fresh copies: the snapshot stays reusable, and pulls still reading the
            # current arrays are not disturbed.
            return self._replace(
                {n: w.copy() for n, w in weights.items()},
                {n: {slot: a.copy() for slot, a in state.items()} for n, state in slots.items()},
                self._snapshot_iterations.get(name, self.model.iterations),
                self._snapshot_guards.get(name),
            )

    def _replace(
        self,
        weights: dict[str, np.ndarray],
        slots: OptimizerState,
        iterations: int,
        guards: Guards | None = None,
    ) -> int:
        """Puts `weights` and `slots` in place between group steps (partial steps are
        applied first); returns the new version. Holds `_cond`."""
        for group in list(self._pending):
            self._complete(group)
        self.model.initialize(weights, self.model.version + 1, slots)
        self.model.iterations = iterations
        return self._replaced(guards)

    def _replaced(self, guards: Guards | None = None) -> int:
        """Follows new weights in place: returns their version. Holds `_cond`."""
        # A gradient computed on the weights replaced is refused.
        self._restored_at = self.model.version
        self._meter = None
        self._compensation.weights_replaced(guards)
        self._cond.notify_all()
        return self.model.version

    # Stats and checkpoints ----------------------------------------------------------------

    def stats(self) -> Stats:
        with self._cond:
            meter = self._meter
            occupied = {worker.group for worker in self._workers.values()}
            updates_applied = sum(self._updates.values())
            stats = Stats(
                model_version=self.model.version,
                updates_applied=updates_applied,
                pushes_received=self._pushes_received,
                pushes_rejected_non_finite=self._rejected_non_finite,
                workers_dropped=self._workers_dropped,
                parameter_count=self.model.parameter_count,
                parameter_bytes=self.model.parameter_bytes,
                hyperparameters=self.model.hyperparameters,
                groups=tuple(
                    GroupStats(
                        group=g,
                        members=tuple(sorted(self._members(g))),
                        updates_applied=self._updates[g],
                        staleness_histogram=dict(self._staleness[g]),
                        **self._batch_stats(g, occupied),
                    )
                    for g in range(self.num_groups)
                ),
                mean_apply_seconds=self.model.apply_seconds_total / max(updates_applied, 1),
                trainings_ended=self._trainings_ended,
                chief_history=self._chief_history,
                chief_batch=self._chief_batch,
                stop_requested=self._stop_requested,
                **self._compensation_stats(),
            )
        # The meter resolves its updates as it is read: off the lock that every update takes.
        return dataclasses.replace(stats, total_momentum=meter.total_momentum() if meter is not None else math.nan)

    def _compensation_stats(self) -> dict:
        if not self.model.initialized:
            return {}
        rule = self._rule_in_force()
        compiled = self.model.hyperparameters
        form = compiled.rule.momentum_form
        compiled_step = effective_step(self._compiled_rate(), compiled.momentum, form)
        return {
            "momentum_in_force": rule.momentum,
            "learning_rate_in_force": rule.learning_rate,
            "implicit_momentum": rule.implicit_momentum,
            "step_backoffs": self._compensation.backoffs,
            "step_share": effective_step(rule.learning_rate, rule.momentum, form) / compiled_step if compiled_step > 0 else 1.0,
        }

    def _batch_stats(self, group: int, occupied: set[int]) -> dict:
        if group not in occupied:
            return {}
        batch, members = self._batch(group)
        return {"next_batch": batch, "next_members": members}

    def checkpoint_state(self) -> ServerState:
        """A consistent copy of everything a restarted server needs."""
        with self._cond:
            weights, slots = self.model.snapshot()
            return ServerState(
                weights=weights,
                slots=slots,
                version=self.model.version,
                iterations=self.model.iterations,
                hyperparameters=self.model.hyperparameters,
                num_groups=self.num_groups,
                assignment=dict(self._assignment),
                # From the first batch whose step is not in the checkpoint: a restarted
                # server hands out again what may not have been used.
                next_batch=min((b for b, _ in self._batch_of_group.values()), default=self._batches_handed_out),
                # Never changed once saved: shared, not copied.
                snapshots=dict(self._snapshots),
                frozen_weights=self._frozen_weights,
            )

    def restore(self, state: ServerState) -> None:
        with self._cond:
            self._meter = None
            self._compensation = AsynchronyCompensation(state.num_groups)
            # The rule first: a rule of another optimizer would discard the restored state.
            self.model.hyperparameters = state.hyperparameters
            self.model.initialize(state.weights, state.version, state.slots)
            self.model.iterations = state.iterations
            self.resumed_from_version = state.version
            self.num_groups = state.num_groups
            self._assignment = dict(state.assignment)
            self._next_worker_id = max(self._assignment, default=0) + 1
            self._batches_handed_out = state.next_batch
            self._batch_of_group.clear()
            self._snapshots = dict(state.snapshots)
            self._frozen_weights = dict(state.frozen_weights)
            self._snapshot_guards.clear()
            self._snapshot_iterations.clear()
            self._cond.notify_all()


def _check_groups(num_groups: int) -> None:
    if not 1 <= num_groups <= MAX_GROUPS:
        raise InvalidArgument(f"num_groups must lie in [1, {MAX_GROUPS}], got {num_groups}")


def _weighted_magnitudes(contributions: list[_Contribution], kept: list[float]) -> dict[str, float] | float:
    """Bounds on the magnitudes in `_weighted_mean`, from those of the members' gradients
    and the shares of their weight they keep: by variable, or summed over the variables
    where a member's are known only as a sum."""
    if kept == [1.0]:
        # One member's, whole: the same numbers, without a sum for each variable.
        magnitudes = contributions[0].magnitudes
        if isinstance(magnitudes, float):
            return magnitudes
        return {name: magnitudes[name] for name in contributions[0].gradients}
    total = sum(c.example_count for c in contributions)
    shares = [c.example_count / total * share for c, share in zip(contributions, kept)]
    by_variable = [c.magnitudes for c in contributions if not isinstance(c.magnitudes, float)]
    if len(by_variable) < len(contributions):
        return sum(share * tensors.total_magnitude(c.magnitudes) for c, share in zip(contributions, shares))
    return {
        name: sum(share * magnitudes[name] for magnitudes, share in zip(by_variable, shares))
        for name in contributions[0].gradients
    }


def _weighted_loss(contributions: list[_Contribution]) -> float | None:
    """The members' losses weighted by example count, None unless every member sent one."""
    losses = [c.loss for c in contributions]
    if None in losses:
        return None
    counts = [c.example_count for c in contributions]
    return sum(count * loss for count, loss in zip(counts, losses) if loss is not None) / sum(counts)


def _pushed_rate(contributions: list[_Contribution]) -> float | None:
    """The learning rates the members pushed, weighted by example count; None unless
    every member pushed one."""
    rates = [c.learning_rate for c in contributions]
    if None in rates:
        return None
    counts = [c.example_count for c in contributions]
    return sum(count * rate for count, rate in zip(counts, rates) if rate is not None) / sum(counts)


def _weighted_mean(contributions: list[_Contribution], kept: list[float]) -> dict[str, np.ndarray]:
    """Mean of the members' gradients weighted by example count, each scaled by the share
    of its weight it `kept`, built in the first member's buffers (they are consumed)."""
    total = sum(c.example_count for c in contributions)
    shares = [c.example_count / total * share for c, share in zip(contributions, kept)]
    combined = contributions[0].gradients
    if shares == [1.0]:
        return combined
    for name, array in combined.items():
        array *= array.dtype.type(shares[0])
        for other, share in zip(contributions[1:], shares[1:]):
            scratch = other.gradients[name]
            scratch *= scratch.dtype.type(share)
            array += scratch
    return combined
