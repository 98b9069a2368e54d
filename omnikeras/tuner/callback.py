"""`OmnivoreCallback`: the Keras face of the tuner. It runs `Tuner` inside `model.fit`,
and reaches the cluster through the strategy's worker."""

import collections
import math
import time
from typing import Any

import keras
import optuna

from omnikeras.convergence import HardwareModel, MeasuredHardwareModel
from omnikeras.parameter_server import Hyperparameters
from omnikeras.profiles import ClusterProfile
from omnikeras.strategy import GroupedAsyncStrategy
from omnikeras.strategy.worker import ClusterWorker
from omnikeras.tuner import records
from omnikeras.tuner.search import Config
from omnikeras.tuner.study import default_study_name, open_study
from omnikeras.tuner.tuning import Step, Tuner, TuningSettings


def _tuned(rule: Hyperparameters) -> str:
    """What the tuner changes of the compiled optimizer, in its own words."""
    momentum = rule.rule.momentum_setting
    if momentum is None:
        return f"{rule.optimizer}'s learning rate and the groups (it has no momentum-like setting the tuner changes)"
    return f"{rule.optimizer}'s learning rate and {momentum}, and the groups"


class OmnivoreCallback(keras.callbacks.Callback):
    """Picks the number of groups, momentum and learning rate that reach `target_loss`
    soonest, and tunes them again as training goes on.

    For models trained under `GroupedAsyncStrategy`. On the chief, the callback runs the
    Omnivore optimizer inside `fit`: short trials, each from the same snapshot of the
    weights on the parameter server, are scored by the convergence-time model (seconds
    per update x updates to reach the target loss on a fixed probe batch of the training
    data, counted from the snapshot) and recorded in an Optuna study; the best
    configuration then trains for a phase about `(1 - tuning_overhead) /
    tuning_overhead` times as long as the tuning took, and the search starts again from
    there. The first phase starts with the compiled settings, then the prototype's cold
    start: synchronous, momentum 0.9, learning rates 0.1 to 0.0001. With several worker
    processes it times every number of groups that divides them and searches from the
    most asynchronous one worth having; with one (the launcher's merged process on a CPU
    host), it tunes momentum and learning rate only, and says so. The momentum is the
    compiled optimizer's momentum-like setting (SGD's, RMSprop's and Muon's `momentum`,
    the `beta_1` of Adam's family and Lion's); Adagrad, Adadelta, Adafactor, Ftrl and
    ScheduleFreeAdamW have none it may change, and only their
    learning rate and the groups are tuned. It says which as it starts. With compensated
    asynchrony (the default) the first phase takes the compiled settings at those groups,
    and later trials continue from one another, so that tuning keeps their training.
    When `fit` knows its length, tuning takes at most `tuning_overhead` of it. When `fit` ends, the model
    holds the best weights reached. On the other workers the callback does nothing.

    Its decisions reach `logs` as `omnivore_groups`, `omnivore_momentum`,
    `omnivore_learning_rate`, `omnivore_staleness` (mean, last phase),
    `omnivore_predicted_spu` and `omnivore_measured_spu` (seconds per update), so the
    progress bar, TensorBoard and CSVLogger show them. The study stays behind: open it
    with Optuna or optuna-dashboard, or `omnikeras report`; a later run of the same
    model, batch size, data size and target finds it and starts from its last choice.

    Args:
        target_loss: The training loss to reach (on the probe batch); positive.
        storage: Where the study lives: None (the default) for `runs/omnivore.db`
            (SQLite), any Optuna RDB URL, a journal file's path, or a storage object.
        study_name: Name of the study in the storage; None (the default) names it after
            the model's architecture and size, the batch size, the data size and the
            target.
        budget: The most steps of the chief in one trial. Defaults to 40; shorter when
            the tuning overhead demands.
        tuning_overhead: Share of the training time spent tuning. Defaults to 0.1.
        profile: Device profile (`omnikeras profile`) of the workers' machine, or its
            JSON file; the hardware model then predicts before it measures. None (the
            default) learns the hardware from measurements alone.
        probe_examples: Training examples of the probe batch that scores every trial.
            Defaults to 512.

    Example:

    ```python
    model.fit(x, y, batch_size=64, epochs=10,
              callbacks=[omnikeras.OmnivoreCallback(target_loss=0.3)])
    ```
    """

    # `fit` under the strategy refuses other owners of the rate beside it.
    tunes_learning_rate = True

    def __init__(
        self,
        target_loss: float,
        storage: str | optuna.storages.BaseStorage | None = None,
        study_name: str | None = None,
        budget: int = 40,
        tuning_overhead: float = 0.1,
        profile: ClusterProfile | str | None = None,
        probe_examples: int = 512,
    ) -> None:
        super().__init__()
        if not (math.isfinite(target_loss) and target_loss > 0):
            raise ValueError(f"target_loss must be a positive number, got {target_loss}")
        if budget < 4:
            raise ValueError(f"budget must be at least 4 steps, got {budget}")
        if not 0 < tuning_overhead < 1:
            raise ValueError(f"tuning_overhead must be in (0, 1), got {tuning_overhead}")
        if probe_examples < 1:
            raise ValueError(f"probe_examples must be at least 1, got {probe_examples}")
        self.target_loss = target_loss
        self.storage = storage
        self.study_name = study_name
        self.budget = budget
        self.tuning_overhead = tuning_overhead
        self.profile = profile
        self.probe_examples = probe_examples
        self._tuner: Tuner | None = None

    def get_config(self) -> dict[str, Any]:
        return {
            "target_loss": self.target_loss,
            "storage": self.storage if isinstance(self.storage, str | None) else repr(self.storage),
            "study_name": self.study_name,
            "budget": self.budget,
            "tuning_overhead": self.tuning_overhead,
            "profile": self.profile if isinstance(self.profile, str | None) else self.profile.model,
            "probe_examples": self.probe_examples,
        }

    # Keras hooks --------------------------------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        strategy = self.model.distribute_strategy
        if not isinstance(strategy, GroupedAsyncStrategy):
            raise ValueError("OmnivoreCallback tunes models trained under omnikeras.GroupedAsyncStrategy")
        self._tuner = None
        if not strategy.config.is_chief:
            return
        worker = strategy.worker
        self._losses = _BatchLosses(worker)
        cluster = _StrategyCluster(worker, self.model, self.probe_examples, self._losses)
        architecture = ">".join(f"{type(layer).__name__}{tuple(layer.output.shape)[1:]}" for layer in self.model.layers)
        name = self.study_name or default_study_name(
            architecture, self.model.count_params(), worker.batch_size, worker.examples, self.target_loss
        )
        study = open_study(self.storage, name, warmup_steps=self.budget // 4)
        hyperparameters = worker.client.describe().hyperparameters
        study.set_user_attr(records.MODEL, {
            "architecture": architecture,
            "parameters": self.model.count_params(),
            "batch_size": worker.batch_size,
            "examples": worker.examples,
            "target_loss": self.target_loss,
            "compensate_asynchrony": hyperparameters.compensate_asynchrony,
        })
        assert worker.place is not None, "the worker registers before training begins"
        compiled = Config(worker.place.num_groups, hyperparameters.learning_rate, hyperparameters.momentum)
        # Under the strategy an epoch is a pass over the data, whose steps Keras does not know.
        epochs, steps = self.params.get("epochs"), self.params.get("steps") or worker.steps_per_epoch
        settings = TuningSettings(
            self.target_loss,
            max_trial_steps=self.budget,
            tuning_overhead=self.tuning_overhead,
            planned_steps=epochs * steps if epochs and steps else None,
        )
        hardware = _hardware_model(self.profile, cluster.devices, worker.batch_size)
        self._started = time.monotonic()
        self._tuner = Tuner(
            cluster, study, settings, compiled, hardware,
            say=lambda line: print(line, flush=True), clock=lambda: time.monotonic() - self._started,
            compensated=hyperparameters.compensate_asynchrony,
            momentum_form=hyperparameters.rule.momentum_form,
        )
        print(f"omnivore: tuning {_tuned(hyperparameters)}", flush=True)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        tuner = self._tuner
        worker_push = self.model.distribute_strategy.worker.last_push
        if tuner is None or worker_push is None:
            return
        loss = self._losses.of_batch(batch, (logs or {}).get("loss", math.nan))
        rejected = self.model.distribute_strategy.worker.rejected_steps > 0
        tuner.step(Step(time.monotonic() - self._started, worker_push.model_version, loss, rejected))
        if logs is not None:
            logs.update(tuner.decision)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._tuner is not None and logs is not None:
            logs.update(self._tuner.decision)

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._tuner is not None:
            self._tuner.end()


class _StrategyCluster:
    """`TuningCluster` through the chief's worker and model."""

    def __init__(self, worker: ClusterWorker, model: keras.Model, probe_examples: int, losses: "_BatchLosses") -> None:
        self._worker = worker
        self._client = worker.client
        self._model = model
        self._probe = worker.probe(probe_examples)
        self._losses = losses
        # Traces the evaluation now, so that the tuner's first timed probe costs what the
        # others will.
        self.probe_loss()

    @property
    def devices(self) -> int:
        return self._worker.config.num_workers

    def save_snapshot(self, name: str) -> None:
        self._client.save_snapshot(name)

    def restore_snapshot(self, name: str) -> int:
        version = self._client.restore_snapshot(name)
        # The running loss of the weights replaced means nothing for the ones put back,
        # and a diverged trial's NaN would stay in it for the rest of the epoch.
        self._model.reset_metrics()
        self._losses.restart()
        return version

    def set_hyperparameters(self, learning_rate: float, momentum: float) -> None:
        self._worker.change_update_rule(learning_rate=learning_rate, momentum=momentum)

    def set_groups(self, num_groups: int) -> None:
        assert self._worker.place is not None
        if num_groups != self._worker.place.num_groups:
            self._client.set_groups(num_groups=num_groups)

    def staleness(self) -> collections.Counter[int]:
        total: collections.Counter[int] = collections.Counter()
        for group in self._client.stats()[0].groups:
            total.update(dict(group.staleness_histogram))
        return total

    def step_share(self) -> float:
        return self._client.stats()[0].step_share

    def probe_loss(self) -> float:
        x, y, sample_weight = self._probe
        loss = self._model.evaluate(x, y, sample_weight=sample_weight, batch_size=len(y), verbose=0, return_dict=True)["loss"]
        # Evaluating reset the training loss's running mean.
        self._losses.restart()
        return float(loss)


class _BatchLosses:
    """Each batch's own loss, from the running mean Keras logs since the epoch began (or
    its metrics were last reset), weighted by each batch's rows, which change with the
    groups."""

    def __init__(self, worker: ClusterWorker) -> None:
        self._worker = worker
        self._batch = -1
        self._sum, self._rows = 0.0, 0

    def restart(self) -> None:
        self._sum, self._rows = 0.0, 0

    def of_batch(self, batch: int, running_mean: float) -> float:
        if batch == 0 or batch <= self._batch:
            self.restart()
        rows = self._worker.example_count
        total = running_mean * (self._rows + rows)
        loss = (total - self._sum) / rows
        self._batch, self._sum, self._rows = batch, total, self._rows + rows
        return loss


def _hardware_model(profile: ClusterProfile | str | None, workers: int, batch_size: int) -> HardwareModel | MeasuredHardwareModel:
    if profile is None:
        return MeasuredHardwareModel(workers)
    if isinstance(profile, str):
        profile = ClusterProfile.load(profile)
    # The workers of a local cluster share this machine's first device.
    return HardwareModel([profile.devices[0]] * workers, batch_size, profile.push_pull_seconds)
