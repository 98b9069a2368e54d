"""The Omnivore optimizer's logic, driven one training step at a time.

A tuning phase saves a snapshot of the weights and measures its loss on a fixed probe
batch. With several worker processes it first times the numbers of groups that divide
them, largest first (a few steps each, from the snapshot), until it knows the largest
that is at least 10% faster per update than the next fewer (the prototype's rule), and
starts the search there. With compensated asynchrony the cold start ends there, with the
compiled settings (`OmnivoreSearch`), and before the first trials at a number of groups
the tuner trains there until compensation's step cap has warmed up (`SETTLED_SHARE`), and
takes the phase's snapshot then: a trial from a cold cap would measure the cap's warm-up,
not its configuration, and the server keeps each snapshot's caps with it, so that every
trial starts from the same ones. Then each configuration the search yields runs as a trial from
the snapshot, for as many updates per group as every other trial; its final weights are
measured on the probe batch, and the convergence-time model turns the two losses, the
updates and the seconds into a time to the target loss (once the probe loss is there, to
half the phase's starting loss), counted from the snapshot. The
best trial's weights carry on with its configuration for a training phase, after which
the next tuning phase starts. The compensated search's later phases run their trials
one after another instead (`OmnivoreSearch.trials_continue`): each starts where the one
before ended, from the probe loss that one ended at, and its fall in loss counts from
the phase's start loss; only a trial that diverges is undone, from the snapshot taken
at its start, so the phase's training is kept and the weights carry on as they are.

The phase's trials are sized to the run: with `fit`'s length known, tuning takes at most
`tuning_overhead` of the planned training time (most of it in the first phase that runs
trials), trials shrink to
fit, and below `min_trial_steps` the search drops its least promising candidates. A
pruned or diverged trial never becomes the best, and never provides the weights that
carry on. When `fit` ends, the weights are the best reached, never an interrupted trial's
(except a continuing trial's, whose weights are training like any other).

Everything here is plain Python: the cluster is reached through `TuningCluster`, Keras
through the callback that calls `step` after each of the chief's steps.
"""

import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import optuna

from omnikeras.convergence import ConvergenceTimeModel, HardwareEfficiency, TrialMeasurement, measured_momentum
from omnikeras.convergence.saturation import most_groups_worth_having
from omnikeras.parameter_server.optimizers import MomentumForm
from omnikeras.tuner import records
from omnikeras.tuner.records import PhaseRecord, TrialRecord
from omnikeras.tuner.search import Config, OmnivoreSearch, Outcome, Phase, rank

PHASE_SNAPSHOT = "omnivore-phase-start"
BEST_SNAPSHOT = "omnivore-best-trial"
# Where a continuing trial began: a trial that diverges is undone from it.
TRIAL_SNAPSHOT = "omnivore-trial-start"
# A trial whose probe loss ends, or whose running loss climbs, above this multiple of
# the probe loss it started from has diverged.
DIVERGENCE_FACTOR = 3.0
# The chief's running loss reaches the pruner this often, in steps.
REPORT_EVERY = 5
# The loss curve kept in the study, one point this often, in steps.
CURVE_EVERY = 10
# Shares of the tuning budget: the first phase that runs trials and each later one.
_FIRST_PHASE_SHARE, _LATER_PHASE_SHARE = 0.6, 0.2
# With compensation, the first trials at a number of groups wait until its step cap
# allows this share of the compiled step, has halved it (found its edge), or this many
# updates have passed: a trial during the warm-up measures the warm-up.
SETTLED_SHARE = 0.5
MAX_SETTLING_UPDATES = 2000
# The cap's share is read this often while settling, in steps.
SETTLING_CHECK_EVERY = 5


class TuningCluster(Protocol):
    """The cluster operations the tuner needs; the strategy's worker provides them, and
    unit tests a fake."""

    @property
    def devices(self) -> int:
        """Worker processes: the numbers of groups that divide it are the choices."""

    def save_snapshot(self, name: str) -> None: ...

    def restore_snapshot(self, name: str) -> int:
        """Puts a snapshot back; returns the server's version after it."""

    def set_hyperparameters(self, learning_rate: float, momentum: float) -> None: ...

    def set_groups(self, num_groups: int) -> None: ...

    def staleness(self) -> collections.Counter[int]:
        """Updates by staleness so far, over every group."""

    def probe_loss(self) -> float:
        """The loss of the current weights on the fixed probe batch."""

    def step_share(self) -> float:
        """The share of the compiled effective step that compensation's cap allows (1
        without compensation or with one group)."""


@dataclass(frozen=True)
class Step:
    """One of the chief's training steps, as the tuner sees it.

    Args:
        seconds: Since `fit` began.
        update: The server's version after the step.
        loss: The chief's loss on its own batch.
        rejected: The server refused the step's gradients (NaN or Inf).
    """

    seconds: float
    update: int
    loss: float
    rejected: bool = False


@dataclass(frozen=True)
class TuningSettings:
    """How long tuning may take.

    Args:
        target_loss: The probe loss to reach.
        max_trial_steps: The longest trial, in the chief's steps: g times as many updates
            with g groups, each group's steps about as many as the chief's.
        tuning_overhead: Share of the training time spent tuning.
        planned_steps: The chief's steps `fit` plans; None when unknown.
        min_trial_steps: The shortest trial worth measuring.
        timing_steps: Steps timed at each number of groups.
        warmup_steps: Steps before the first phase, which time a step.
    """

    target_loss: float
    max_trial_steps: int = 40
    tuning_overhead: float = 0.1
    planned_steps: int | None = None
    min_trial_steps: int = 6
    timing_steps: int = 5
    warmup_steps: int = 3


@dataclass
class _Timing:
    # Still to time, largest first.
    groups: list[int]
    restored_at: int
    started: float | None = None
    steps: int = 0


@dataclass
class _Settling:
    # Training at these groups until their step cap has warmed up; then the search.
    groups: int
    # When settling began, in `Step.seconds`.
    began: float
    started_at: int | None = None
    share: float = 0.0
    steps: int = 0


@dataclass
class _Trial:
    config: Config
    trial: optuna.trial.Trial
    restored_at: int
    started: float
    staleness_before: collections.Counter
    # The probe loss the trial started from: the phase's, unless it continues another.
    start_loss: float
    continues: bool = False
    losses: list[float] = field(default_factory=list)
    diverged: bool = False


class Tuner:
    """Tunes the number of groups, momentum and learning rate while training runs.

    Args:
        cluster: The cluster to steer.
        study: Where every trial and phase is recorded.
        settings: The target and the budget.
        compiled: The configuration training started with.
        hardware: Predicts seconds per update; every measurement corrects it.
        say: Where the tuner's decisions are reported.
        clock: Seconds since `fit` began, as in `Step.seconds`: when a trial begins,
            after the probe of the one before.
        compensated: The server compensates asynchrony (`OmnivoreSearch`'s compensated
            search, whose momenta are totals).
        momentum_form: How the compiled optimizer's momentum-like setting enters its
            update (`OmnivoreSearch`'s).
    """

    def __init__(
        self,
        cluster: TuningCluster,
        study: optuna.Study,
        settings: TuningSettings,
        compiled: Config,
        hardware: HardwareEfficiency,
        say: Callable[[str], None],
        clock: Callable[[], float],
        compensated: bool = False,
        momentum_form: MomentumForm = "heavy ball",
    ) -> None:
        self.cluster = cluster
        self._clock = clock
        self.study = study
        self.settings = settings
        self.hardware = hardware
        self.convergence = ConvergenceTimeModel(settings.target_loss, hardware)
        self.search = OmnivoreSearch(cluster.devices, compiled, compensated=compensated, momentum_form=momentum_form)
        self._say = say
        self.current = compiled
        earlier = PhaseRecord.read_all(study)
        # The cold start reuses what an earlier run of the same study found.
        self._resumed_from = earlier[-1].config if earlier else None
        self._phase_index = max((p.index for p in earlier), default=-1)
        self._first_phase = self._phase_index + 1
        self._steps = 0
        self._last_update = 0
        self._step_seconds: list[float] = []
        self._last_seconds: float | None = None
        self._probe_seconds = 0.0
        self._tuning_spent = 0.0
        self._state: _Timing | _Settling | _Trial | float | None = None  # a float: train until then
        # Whether this phase's trials continue from one another, and the probe loss the next starts from.
        self._continuing = False
        self._next_start_loss = math.nan
        self._phase_trials = 0
        self._phase: Phase | None = None
        self._best: tuple[Config, Outcome] | None = None
        self._start_loss = math.nan
        self._measured: dict[int, float] = {}
        self._trial_steps = settings.max_trial_steps
        self._phase_started = 0.0
        self._curve: list[list[float]] = []
        # The numbers of groups whose step cap has warmed up before a phase's trials.
        self._settled: set[int] = set()
        # Whether a phase ran trials yet.
        self._searched = False
        self.decision: dict[str, float] = {
            "omnivore_groups": compiled.num_groups,
            "omnivore_momentum": compiled.momentum,
            "omnivore_learning_rate": compiled.learning_rate,
            "omnivore_staleness": math.nan,
            "omnivore_predicted_spu": math.nan,
            "omnivore_measured_spu": math.nan,
        }
        if cluster.devices == 1:
            say("omnivore: one worker process, one device: tuning momentum and learning rate only")
        if self._resumed_from is not None:
            say(f"omnivore: starting from what an earlier run of this study chose: {records.words(self._resumed_from)}")

    # Driven by the callback ---------------------------------------------------------------

    def step(self, step: Step) -> None:
        """After each of the chief's steps."""
        self._steps += 1
        if self._last_seconds is not None:
            self._step_seconds.append(step.seconds - self._last_seconds)
        self._last_seconds = step.seconds
        self._last_update = step.update
        if self._steps % CURVE_EVERY == 0:
            self._curve.append([step.seconds, step.update, step.loss])
        state = self._state
        if isinstance(state, _Timing):
            self._timing_step(state, step)
        elif isinstance(state, _Settling):
            self._settling_step(state, step)
        elif isinstance(state, _Trial):
            self._trial_step(state, step)
        elif state is None and self._steps >= self.settings.warmup_steps:
            self._start_phase(step.seconds)
        elif isinstance(state, float) and step.seconds >= state:
            self._start_phase(step.seconds)

    def end(self) -> None:
        """`fit` is ending: an interrupted trial or timing run gives way to the best
        weights reached, and the study keeps the loss curve."""
        state = self._state
        if isinstance(state, _Trial):
            self._record(state, math.nan, updates=0, seconds=math.nan, interrupted=True)
            self.study.tell(state.trial, state=optuna.trial.TrialState.PRUNED)
        if isinstance(state, _Settling):
            # Training while the cap warms up: its weights are kept, with its settings.
            self.current = Config(state.groups, self.current.learning_rate, self.current.momentum)
        elif isinstance(state, _Trial) and state.continues:
            self._apply(self.current)
        elif isinstance(state, _Trial | _Timing):
            best = self._best is not None and self._best[0] == self.current
            self.cluster.restore_snapshot(BEST_SNAPSHOT if best else PHASE_SNAPSHOT)
            self._apply(self.current)
        self._state = math.inf
        self.study.set_user_attr(records.LOSS_CURVE, self._curve)

    # Phases -------------------------------------------------------------------------------

    def _start_phase(self, now: float) -> None:
        budget = self._phase_budget()
        if budget is not None and budget <= 0:
            self._state = math.inf  # the tuning budget is spent: train to the end
            return
        self._phase_index += 1
        self._phase_started = now
        self._best = None
        self.cluster.save_snapshot(PHASE_SNAPSHOT)
        self._set_start_loss()
        self._measured = {}
        if len(self._choices()) > 1:
            self._begin_timing(_Timing(sorted(self._choices(), reverse=True), restored_at=-1))
        else:
            self._begin_search(1, now)

    def _set_start_loss(self) -> None:
        self._start_loss = self._timed_probe()
        # Once the probe loss is at the target, trials are ranked by how soon they halve it:
        # the time to any loss below the start ranks them by the same rate.
        target = self.settings.target_loss
        self.convergence = ConvergenceTimeModel(
            target if not self._start_loss <= target else self._start_loss / 2, self.hardware
        )

    def _begin_timing(self, timing: _Timing) -> None:
        timing.restored_at = self.cluster.restore_snapshot(PHASE_SNAPSHOT)
        self.cluster.set_groups(timing.groups[0])
        timing.started, timing.steps = None, 0
        self._state = timing

    def _timing_step(self, timing: _Timing, step: Step) -> None:
        # Steps on weights from before the restore, or of the old layout, are not timed.
        if step.update <= timing.restored_at + 1:
            return
        if timing.started is None:
            timing.started, timing.restored_at = step.seconds, step.update
            return
        timing.steps += 1
        if timing.steps < self.settings.timing_steps:
            return
        groups = timing.groups.pop(0)
        seconds = (step.seconds - timing.started) / max(step.update - timing.restored_at, 1)
        self._measured[groups] = seconds
        self.hardware.observe(groups, seconds)
        start = most_groups_worth_having(self._measured, self._choices())
        if start is None:
            self._begin_timing(timing)
            return
        self._say(
            f"omnivore phase {self._phase_index}: seconds per update "
            + ", ".join(f"{s:.3g} with {g}" for g, s in sorted(self._measured.items()))
            + f" groups: searching from {start} group{'s' * (start > 1)}"
            + (", compensated (momenta are totals)" if self.search.compensated and start > 1 else "")
        )
        self._begin_search(start, step.seconds)

    def _settle(self, groups: int, now: float) -> None:
        """Trains at `groups` with the current settings until their step cap has warmed up
        (at once where it has); the phase's snapshot and trials follow."""
        self.cluster.restore_snapshot(PHASE_SNAPSHOT)
        self._apply(Config(groups, self.current.learning_rate, self.current.momentum))
        self._state = _Settling(groups, began=now)

    def _settling_step(self, settling: _Settling, step: Step) -> None:
        if settling.started_at is None:
            settling.started_at = step.update
        settling.steps += 1
        if settling.steps % SETTLING_CHECK_EVERY:
            return
        share = self.cluster.step_share()
        updates = step.update - settling.started_at
        halved = share < settling.share
        if settling.steps == SETTLING_CHECK_EVERY and share < SETTLED_SHARE:
            self._say(
                f"omnivore phase {self._phase_index}: training with {settling.groups} groups while compensation's step"
                f" cap warms up (at {share:.2g} of the compiled step; the trials start at {SETTLED_SHARE:g}, at its"
                f" first halving, or after {MAX_SETTLING_UPDATES} updates)"
            )
        settling.share = share
        if share < SETTLED_SHARE and not halved and updates < MAX_SETTLING_UPDATES:
            return
        if settling.steps > SETTLING_CHECK_EVERY:
            self._say(
                f"omnivore phase {self._phase_index}: the step cap allows {share:.2g} of the compiled step after"
                f" {updates} updates{' (halved)' if halved else ''}: searching"
            )
        # Training, not tuning: the phase's snapshot starts here, and its budget leaves the
        # settling out.
        self.cluster.save_snapshot(PHASE_SNAPSHOT)
        self._set_start_loss()
        self._phase_started += step.seconds - settling.began
        self._settled.add(settling.groups)
        self._begin_search(settling.groups, step.seconds)

    def _begin_search(self, start_groups: int, now: float) -> None:
        cold = self._phase_index == self._first_phase and self._resumed_from is None
        # The compensated cold start runs no trials (it only chooses the groups): nothing to settle for.
        if self.search.compensated and not cold and start_groups > 1 and start_groups not in self._settled:
            self._settle(start_groups, now)
            return
        current = None if cold else (self._resumed_from if self._phase_index == self._first_phase else self.current)
        self._continuing = self.search.trials_continue(start_groups, cold)
        self._next_start_loss = self._start_loss
        self._phase_trials = 0
        planned = self.search.planned_trials(start_groups, cold)
        self._trial_steps, max_trials = self._trial_size(planned, now)
        self._phase = self.search.phase(self._phase_index, start_groups, current, max_trials)
        self._advance(None, now)

    def _advance(self, outcome: Outcome | None, now: float) -> None:
        """Starts the search's next trial, or ends the phase with its choice."""
        assert self._phase is not None
        try:
            config = next(self._phase) if outcome is None else self._phase.send(outcome)
        except StopIteration as done:
            self._finish_phase(done.value, now)
            return
        self._begin_trial(config)

    def _begin_trial(self, config: Config) -> None:
        self._phase_trials += 1
        if self._continuing:
            self.cluster.save_snapshot(TRIAL_SNAPSHOT)
            restored_at = self._last_update
        else:
            restored_at = self.cluster.restore_snapshot(PHASE_SNAPSHOT)
        self._apply(config)
        self.study.enqueue_trial(records.params_of(config), user_attrs={"phase": self._phase_index})
        trial = self.study.ask(records.PARAMS)
        # The trial's time counts from the snapshot's return, not from the probe before it.
        self._state = _Trial(
            config, trial, restored_at, self._clock(), self.cluster.staleness(), self._next_start_loss, self._continuing
        )

    def _trial_step(self, running: _Trial, step: Step) -> None:
        if step.update <= running.restored_at:
            return  # computed on the weights from before the restore
        running.losses.append(step.loss)
        if step.rejected or not math.isfinite(step.loss):
            running.diverged = True
            self._end_trial(running, step)
            return
        steps = len(running.losses)
        if steps % REPORT_EVERY == 0:
            running_loss = sum(running.losses[-REPORT_EVERY:]) / REPORT_EVERY
            if running_loss > DIVERGENCE_FACTOR * running.start_loss:
                # Judged before the pruner: a blow-up it prunes must still count as one,
                # or the search would go on to try larger rates and momenta.
                running.diverged = True
                self._end_trial(running, step)
                return
            # The pruner compares trials at equal steps from one start: a continuing trial has its own.
            if not running.continues:
                running.trial.report(running_loss, steps)
            if not running.continues and running.trial.should_prune():
                self._end_trial(running, step, pruned=True)
                return
        # Every trial of g groups runs as many updates, whatever the chief's share of them:
        # extrapolations from unequal stretches of the loss curve are not comparable.
        if step.update - running.restored_at >= self._trial_steps * running.config.num_groups:
            self._end_trial(running, step)

    def _end_trial(self, running: _Trial, step: Step, pruned: bool = False) -> None:
        # A pruned trial never wins: its weights need no probe.
        end_loss = math.nan if running.diverged or pruned else self._timed_probe()
        diverged = running.diverged or (
            not pruned and (not math.isfinite(end_loss) or end_loss > DIVERGENCE_FACTOR * running.start_loss)
        )
        record = self._record(
            running, end_loss, step.update - running.restored_at, step.seconds - running.started, diverged, pruned
        )
        outcome = record.outcome
        if outcome.usable:
            self.study.tell(running.trial, outcome.time_to_target)
        else:
            self.study.tell(running.trial, state=optuna.trial.TrialState.PRUNED)
        if running.continues:
            if diverged:
                # The next trial counts the steps from the restore on.
                self._last_update = self.cluster.restore_snapshot(TRIAL_SNAPSHOT)
            else:
                self._next_start_loss = end_loss
        elif outcome.usable and (self._best is None or rank(running.config, outcome) < rank(*self._best)):
            # The best trial's progress is kept, not thrown away with the others'.
            self._best = (running.config, outcome)
            self.cluster.save_snapshot(BEST_SNAPSHOT)
        self._advance(outcome, step.seconds)

    def _record(
        self,
        running: _Trial,
        end_loss: float,
        updates: int,
        seconds: float,
        diverged: bool = False,
        pruned: bool = False,
        interrupted: bool = False,
    ) -> TrialRecord:
        # A continuing trial's fall in loss, as if from the phase's start loss.
        from_phase_start = end_loss * self._start_loss / running.start_loss
        estimate = self.convergence.estimate(
            TrialMeasurement(running.config.num_groups, updates, seconds, self._start_loss, from_phase_start)
        )
        staleness = self.cluster.staleness() - running.staleness_before
        ttt = math.inf if diverged else estimate.time_to_target
        record = TrialRecord(
            phase=self._phase_index,
            steps=len(running.losses),
            updates=updates,
            seconds=seconds,
            probe_loss_start=running.start_loss,
            probe_loss_end=end_loss,
            time_to_target=ttt,
            updates_to_target=estimate.updates_to_target,
            predicted_seconds_per_update=estimate.predicted_seconds_per_update,
            measured_seconds_per_update=estimate.measured_seconds_per_update,
            mean_staleness=_mean(staleness),
            measured_momentum=measured_momentum(staleness),
            diverged=diverged,
            pruned=pruned,
            interrupted=interrupted,
        )
        record.write(running.trial)
        return record

    def _finish_phase(self, chosen: Config | None, now: float) -> None:
        tuning_seconds = now - self._phase_started
        self._tuning_spent += tuning_seconds
        if chosen is None:
            # Nothing tried did better than nothing: keep training as before.
            self._say(f"omnivore phase {self._phase_index}: no configuration made progress; keeping {records.words(self.current)}")
            chosen = self.current
        trials = self._phase_trials
        self._searched = self._searched or trials > 0
        if not self._continuing:
            best = self._best is not None and self._best[0] == chosen
            self.cluster.restore_snapshot(BEST_SNAPSHOT if best else PHASE_SNAPSHOT)
        self._apply(chosen)
        self.current = chosen
        training_seconds = tuning_seconds * (1 - self.settings.tuning_overhead) / self.settings.tuning_overhead
        self._state = now + training_seconds
        chosen_record = self._chosen_record(chosen)
        self.decision = {
            "omnivore_groups": chosen.num_groups,
            "omnivore_momentum": chosen.momentum,
            "omnivore_learning_rate": chosen.learning_rate,
            "omnivore_staleness": chosen_record.mean_staleness if chosen_record else math.nan,
            "omnivore_predicted_spu": self._predicted(chosen.num_groups),
            "omnivore_measured_spu": chosen_record.measured_seconds_per_update if chosen_record else math.nan,
        }
        PhaseRecord(self._phase_index, chosen, tuning_seconds, training_seconds, dict(self._measured)).write(self.study)
        how = (
            f"{trials} trial{'s' * (trials != 1)} of {self._trial_steps} steps"
            if trials
            else "compensated: the compiled settings at the most groups worth having, from the timing alone"
        )
        self._say(
            f"omnivore phase {self._phase_index}: {records.words(chosen)} (tuned in {tuning_seconds:.1f} s, {how};"
            f" next tuning in {training_seconds:.0f} s)"
        )

    # Helpers ------------------------------------------------------------------------------

    def _apply(self, config: Config) -> None:
        self.cluster.set_hyperparameters(config.learning_rate, config.momentum)
        self.cluster.set_groups(config.num_groups)

    def _timed_probe(self) -> float:
        started = time.monotonic()
        loss = self.cluster.probe_loss()
        self._probe_seconds = time.monotonic() - started
        return loss

    def _phase_budget(self) -> float | None:
        """Seconds the phase starting may tune for; None when `fit`'s length is unknown."""
        if self.settings.planned_steps is None:
            return None
        total = self.settings.tuning_overhead * self.settings.planned_steps * self._seconds_per_step()
        # The first phase that runs trials gets the first share: with compensation the
        # cold start runs none.
        share = _LATER_PHASE_SHARE if self._searched else _FIRST_PHASE_SHARE
        return min(share * total, total - self._tuning_spent)

    def _trial_size(self, planned_trials: int, now: float) -> tuple[int, int | None]:
        """Steps per trial and the most trials, to stay within the phase's budget."""
        budget = self._phase_budget()
        if budget is None:
            return self.settings.max_trial_steps, None
        left = budget - (now - self._phase_started)
        step = self._seconds_per_step()
        steps = int((left / max(planned_trials, 1) - self._probe_seconds) / step)
        if steps >= self.settings.min_trial_steps:
            return min(steps, self.settings.max_trial_steps), None
        # Too short to tell anything: fewer candidates, the least promising dropped.
        shortest = self.settings.min_trial_steps
        return shortest, max(2, int(left / (shortest * step + self._probe_seconds)))

    def _choices(self) -> list[int]:
        """The numbers of groups that divide the worker processes."""
        return [g for g in range(1, self.cluster.devices + 1) if self.cluster.devices % g == 0]

    def _seconds_per_step(self) -> float:
        recent = self._step_seconds[-20:]
        return sorted(recent)[len(recent) // 2] if recent else 1.0

    def _chosen_record(self, chosen: Config) -> TrialRecord | None:
        for trial in reversed(self.study.get_trials(deepcopy=False)):
            record = TrialRecord.read(trial)
            if record is not None and record.phase == self._phase_index and records.config_of(trial.params) == chosen:
                return record
        return None

    def _predicted(self, groups: int) -> float:
        try:
            return self.hardware.seconds_per_update(groups)
        except ValueError:  # nothing measured yet
            return math.nan


def _mean(histogram: collections.Counter) -> float:
    total = sum(histogram.values())
    return sum(lag * count for lag, count in histogram.items()) / total if total else 0.0
