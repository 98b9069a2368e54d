"""`OmnivoreCallback`: tunes groups, momentum and learning rate while `model.fit` runs."""

import dataclasses
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import keras
import optuna

from omnikeras.convergence import (
    ConvergenceTimeModel,
    HardwareModel,
    MeasuredHardwareModel,
    TrialMeasurement,
    measured_momentum,
)
from omnikeras.parameter_server import Hyperparameters
from omnikeras.profiles import ClusterProfile
from omnikeras.strategy import GroupedAsyncStrategy
from omnikeras.tuner import study as studies
from omnikeras.tuner.search import Config, OmnivoreSearch, Outcome, Phase

logger = logging.getLogger(__name__)

_PHASE_SNAPSHOT = "omnivore-phase-start"
_BEST_SNAPSHOT = "omnivore-best-trial"
# A trial whose loss (over its last steps) climbs past this multiple of where it started
# (over its first steps) has diverged.
_DIVERGENCE_FACTOR = 3.0
# Intermediate values reach the pruner this often, in steps.
_REPORT_EVERY = 5
# The loss curve kept in the study, one point this often, in steps.
_CURVE_EVERY = 10


@dataclass
class _Point:
    seconds: float
    update: int
    loss: float


@dataclass
class _RunningTrial:
    config: Config
    trial: optuna.trial.Trial
    staleness_before: Counter
    # The version the snapshot was restored as: steps up to it ran on the weights before.
    restored_at: int
    points: list[_Point] = field(default_factory=list)


class OmnivoreCallback(keras.callbacks.Callback):
    """Picks the number of groups, momentum and learning rate that reach `target_loss`
    soonest, and tunes them again as training goes on.

    For models trained under `GroupedAsyncStrategy`. On the chief, the callback runs the
    Omnivore optimizer inside `fit`: short trials, each from the same snapshot of the
    weights on the parameter server, are scored by the convergence-time model (seconds
    per update x updates to reach the target loss) and recorded in an Optuna study; the
    best configuration then trains for a phase about `(1 - tuning_overhead) /
    tuning_overhead` times as long as the tuning took, and the search starts again from
    there with the current learning rate and its tenth. The first phase starts where the
    prototype does: synchronous, momentum 0.9, learning rates 0.1 to 0.0001. The numbers
    of groups it considers divide the number of worker processes, so launch as many as
    groups it may choose (`omnikeras launch --groups 4`). On the other workers the
    callback does nothing.

    Its decisions reach `logs` as `omnivore_groups`, `omnivore_momentum`,
    `omnivore_learning_rate`, `omnivore_staleness` (mean, last phase),
    `omnivore_predicted_spu` and `omnivore_measured_spu` (seconds per update), so the
    progress bar, TensorBoard and CSVLogger show them. The study stays behind: open it
    with Optuna or optuna-dashboard, or `omnikeras report`; running the same script again
    resumes it without repeating the trials it finished.

    Args:
        target_loss: The training loss to reach; positive.
        storage: Where the study lives: None (the default) for `runs/omnivore.db`
            (SQLite), any Optuna RDB URL, a journal file's path, or a storage object.
        study_name: Name of the study in the storage. Defaults to `"omnivore"`.
        budget: Steps of the chief in each trial. Defaults to 40.
        tuning_overhead: Share of the time spent tuning. Defaults to 0.1.
        profile: Device profile (`omnikeras profile`) of the workers' machine, or its
            JSON file; the hardware model then predicts before it measures. None (the
            default) learns the hardware from the trials alone.

    Example:

    ```python
    model.fit(x, y, batch_size=64, epochs=10,
              callbacks=[omnikeras.OmnivoreCallback(target_loss=0.3)])
    ```
    """

    def __init__(
        self,
        target_loss: float,
        storage: str | optuna.storages.BaseStorage | None = None,
        study_name: str = "omnivore",
        budget: int = 40,
        tuning_overhead: float = 0.1,
        profile: ClusterProfile | str | None = None,
    ) -> None:
        super().__init__()
        if not (math.isfinite(target_loss) and target_loss > 0):
            raise ValueError(f"target_loss must be a positive number, got {target_loss}")
        if budget < 4:
            raise ValueError(f"budget must be at least 4 steps, got {budget}")
        if not 0 < tuning_overhead < 1:
            raise ValueError(f"tuning_overhead must be in (0, 1), got {tuning_overhead}")
        self.target_loss = target_loss
        self.storage = storage
        self.study_name = study_name
        self.budget = budget
        self.tuning_overhead = tuning_overhead
        self.profile = profile

    def get_config(self) -> dict[str, Any]:
        return {
            "target_loss": self.target_loss,
            "storage": self.storage if isinstance(self.storage, str | None) else repr(self.storage),
            "study_name": self.study_name,
            "budget": self.budget,
            "tuning_overhead": self.tuning_overhead,
            "profile": self.profile if isinstance(self.profile, str | None) else self.profile.model,
        }

    # Keras hooks --------------------------------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        strategy = self.model.distribute_strategy
        if not isinstance(strategy, GroupedAsyncStrategy):
            raise ValueError("OmnivoreCallback tunes models trained under omnikeras.GroupedAsyncStrategy")
        self._active = strategy.config.is_chief
        if not self._active:
            return
        self._worker = strategy.worker
        self._client = strategy.worker.client
        workers = strategy.config.num_workers
        self._hardware = _hardware_model(self.profile, workers, self._worker.batch_size)
        self._convergence = ConvergenceTimeModel(self.target_loss, self._hardware)
        self._study = studies.open_study(self.storage, self.study_name, warmup_steps=self.budget // 2)
        self._search = OmnivoreSearch(workers, max_groups=self._hardware.saturation_groups())
        self._nesterov = bool(self.model.optimizer.nesterov)
        self._train_started = time.monotonic()
        self._steps = 0
        self._batch_in_epoch = -1
        self._loss_sum, self._rows_seen = 0.0, 0
        self._current: Config | None = None
        self._phase_index = -1
        self._curve: list[list[float]] = []
        # The same keys from the first epoch on: CSVLogger fixes its columns then.
        hyperparameters = self._client.describe().hyperparameters
        self._decision = {
            "omnivore_groups": self._worker.place.num_groups,
            "omnivore_momentum": hyperparameters.momentum,
            "omnivore_learning_rate": hyperparameters.learning_rate,
            "omnivore_staleness": math.nan,
            "omnivore_predicted_spu": math.nan,
            "omnivore_measured_spu": math.nan,
        }
        self._start_phase()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self._active or self._worker.last_push is None:
            return
        loss = self._batch_loss(batch, (logs or {}).get("loss", math.nan))
        point = _Point(time.monotonic() - self._train_started, self._worker.last_push.model_version, loss)
        self._steps += 1
        if self._steps % _CURVE_EVERY == 0:
            self._curve.append([point.seconds, point.update, point.loss])
        if self._trial is not None:
            self._trial_step(point)
        elif point.seconds >= self._phase_ends_at:
            self._start_phase()
        if logs is not None:
            logs.update(self._decision)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._active and logs is not None:
            logs.update(self._decision)

    def on_train_end(self, logs: dict | None = None) -> None:
        if not self._active:
            return
        if self._trial is not None:
            self._trial.trial.set_user_attr("interrupted", True)
            self._study.tell(self._trial.trial, state=optuna.trial.TrialState.PRUNED)
            self._trial = None
        self._study.set_user_attr("loss_curve", self._curve)

    # Phases -------------------------------------------------------------------------------

    def _start_phase(self) -> None:
        self._phase_index += 1
        self._client.save_snapshot(_PHASE_SNAPSHOT)
        self._phase: Phase = self._search.phase(self._phase_index, self._current)
        self._phase_started = time.monotonic()
        self._best_time = math.inf
        self._trial: _RunningTrial | None = None
        self._advance(None)

    def _advance(self, outcome: Outcome | None) -> None:
        """Starts the search's next trial, or ends the phase with its choice."""
        try:
            config = next(self._phase) if outcome is None else self._phase.send(outcome)
        except StopIteration as done:
            self._finish_phase(done.value)
            return
        except RuntimeError as nothing_usable:
            # Training goes on, carefully, rather than ending on a bad search.
            fallback = Config(1, min(c.learning_rate for c in self._search.results) / 10, 0.0)
            logger.warning("omnivore: %s; going on with %s", nothing_usable, fallback)
            self._finish_phase(fallback)
            return
        self._begin(config)

    def _begin(self, config: Config) -> None:
        """Starts a trial of `config`, or takes the outcome an earlier run recorded."""
        finished = studies.finished_trial(self._study, self._phase_index, config)
        if finished is not None:
            print(f"omnivore: trial {finished.number} of an earlier run already measured {config}", flush=True)
            measured = finished.user_attrs.get("measured_seconds_per_update", math.inf)
            if math.isfinite(measured):
                self._hardware.observe(config.num_groups, measured)
            self._advance(studies.outcome_of(finished))
            return
        restored_at = self._client.restore_snapshot(_PHASE_SNAPSHOT)
        self._apply(config)
        self._restart_loss_mean()
        self._study.enqueue_trial(studies.params_of(config), user_attrs={"phase": self._phase_index})
        trial = self._study.ask(studies.DISTRIBUTIONS)
        self._trial = _RunningTrial(config, trial, self._staleness(), restored_at)

    def _trial_step(self, point: _Point) -> None:
        running = self._trial
        assert running is not None
        if point.update <= running.restored_at:
            return
        running.points.append(point)
        steps = len(running.points)
        window = min(_REPORT_EVERY, steps // 2)
        diverged = not math.isfinite(point.loss) or self._worker.rejected_steps > 0 or (
            window > 0
            and _mean_loss(running.points[-window:]) > _DIVERGENCE_FACTOR * _mean_loss(running.points[:window])
        )
        if steps % _REPORT_EVERY == 0 and not diverged:
            # A single batch's loss is too noisy to prune on.
            running.trial.report(_mean_loss(running.points[-_REPORT_EVERY:]), steps)
        if diverged or steps >= self.budget or (steps % _REPORT_EVERY == 0 and running.trial.should_prune()):
            self._end_trial(diverged)

    def _end_trial(self, diverged: bool) -> None:
        running = self._trial
        assert running is not None
        self._trial = None
        # The points start after the restore: the whole trial shows its configuration.
        points = running.points
        measurement = TrialMeasurement(
            running.config.num_groups,
            updates=[p.update for p in points],
            losses=[p.loss for p in points],
            seconds=points[-1].seconds - points[0].seconds,
        )
        estimate = self._convergence.estimate(measurement)
        time_to_target = math.inf if diverged else estimate.time_to_target
        staleness = self._staleness() - running.staleness_before
        attrs = {
            "phase": self._phase_index,
            "diverged": diverged,
            "time_to_target": time_to_target,
            "updates_to_target": estimate.updates_to_target,
            "predicted_seconds_per_update": estimate.predicted_seconds_per_update,
            "measured_seconds_per_update": estimate.measured_seconds_per_update,
            "mean_staleness": _mean(staleness),
            "measured_momentum": measured_momentum(staleness),
            "final_loss": running.points[-1].loss,
        }
        for key, value in attrs.items():
            running.trial.set_user_attr(key, value)
        pruned = len(running.points) < self.budget
        if diverged or pruned or not math.isfinite(time_to_target):
            self._study.tell(running.trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self._study.tell(running.trial, time_to_target)
        logger.info("omnivore: trial %d %s: %s", running.trial.number, running.config, attrs)
        if time_to_target < self._best_time:
            # The best trial's progress is kept, not thrown away with the others'.
            self._best_time = time_to_target
            self._best_config = running.config
            self._client.save_snapshot(_BEST_SNAPSHOT)
        self._advance(Outcome(time_to_target, diverged))

    def _finish_phase(self, chosen: Config) -> None:
        tuning_seconds = time.monotonic() - self._phase_started
        if math.isfinite(self._best_time) and chosen == self._best_config:
            self._client.restore_snapshot(_BEST_SNAPSHOT)
        else:
            self._client.restore_snapshot(_PHASE_SNAPSHOT)
        self._apply(chosen)
        self._restart_loss_mean()
        self._current = chosen
        training_seconds = tuning_seconds * (1 - self.tuning_overhead) / self.tuning_overhead
        self._phase_ends_at = time.monotonic() - self._train_started + training_seconds
        try:
            predicted = self._hardware.seconds_per_update(chosen.num_groups)
        except ValueError:  # nothing measured: every trial diverged
            predicted = math.nan
        self._decision = {
            "omnivore_groups": chosen.num_groups,
            "omnivore_momentum": chosen.momentum,
            "omnivore_learning_rate": chosen.learning_rate,
            "omnivore_staleness": self._chosen_attr("mean_staleness"),
            "omnivore_predicted_spu": predicted,
            "omnivore_measured_spu": self._chosen_attr("measured_seconds_per_update"),
        }
        self._study.set_user_attr(
            f"phase_{self._phase_index}",
            dataclasses.asdict(chosen) | {"tuning_seconds": tuning_seconds, "training_seconds": training_seconds},
        )
        print(
            f"omnivore phase {self._phase_index}: {chosen.num_groups} groups, momentum "
            f"{chosen.momentum:g}, learning rate {chosen.learning_rate:g} (tuned in "
            f"{tuning_seconds:.1f} s; next tuning in {training_seconds:.0f} s)",
            flush=True,
        )

    # Helpers ------------------------------------------------------------------------------

    def _apply(self, config: Config) -> None:
        self._client.set_hyperparameters(Hyperparameters(config.learning_rate, config.momentum, self._nesterov))
        if config.num_groups != self._worker.place.num_groups:
            self._client.set_groups(num_groups=config.num_groups)

    def _chosen_attr(self, key: str) -> float:
        for trial in reversed(self._study.get_trials(deepcopy=False)):
            if trial.user_attrs.get("phase") == self._phase_index and trial.params == studies.params_of(self._current):
                return float(trial.user_attrs.get(key, math.nan))
        return math.nan

    def _staleness(self) -> Counter:
        total: Counter = Counter()
        for group in self._client.stats()[0].groups:
            total.update(dict(group.staleness_histogram))
        return total

    def _restart_loss_mean(self) -> None:
        # A diverged trial's NaN would poison Keras' epoch mean for the rest of the epoch.
        self.model.reset_metrics()
        self._loss_sum, self._rows_seen = 0.0, 0

    def _batch_loss(self, batch: int, running_mean: float) -> float:
        """This batch's own loss. Keras logs the mean since the epoch began (or since the
        metrics were last reset), weighted by the rows of each batch; this worker's rows
        change when the groups do."""
        if batch == 0 or batch <= self._batch_in_epoch:
            self._loss_sum, self._rows_seen = 0.0, 0
        rows = self._worker.example_count
        total = running_mean * (self._rows_seen + rows)
        loss = (total - self._loss_sum) / rows
        self._batch_in_epoch, self._loss_sum, self._rows_seen = batch, total, self._rows_seen + rows
        return loss


def _hardware_model(profile: ClusterProfile | str | None, workers: int, batch_size: int) -> HardwareModel | MeasuredHardwareModel:
    if profile is None:
        return MeasuredHardwareModel(workers)
    if isinstance(profile, str):
        profile = ClusterProfile.load(profile)
    # The workers of a local cluster share this machine's first device.
    return HardwareModel([profile.devices[0]] * workers, batch_size, profile.push_pull_seconds)


def _mean_loss(points: list[_Point]) -> float:
    return sum(p.loss for p in points) / len(points)


def _mean(histogram: Counter) -> float:
    total = sum(histogram.values())
    return sum(lag * count for lag, count in histogram.items()) / total if total else 0.0
