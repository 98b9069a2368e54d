"""What the tuner leaves in its Optuna study, in one place: the trials' parameters and
attributes, each phase's choice, the study's own attributes. The tuner writes them through
this module and `omnikeras report` reads them through it."""

import dataclasses
import math
import re
from dataclasses import dataclass, field

import optuna

from omnikeras.tuner.search import Config, Outcome

PARAMS: dict[str, optuna.distributions.BaseDistribution] = {
    "num_groups": optuna.distributions.IntDistribution(1, 1024),
    "learning_rate": optuna.distributions.FloatDistribution(1e-8, 100.0, log=True),
    "momentum": optuna.distributions.FloatDistribution(-0.99, 0.99),
}
# Study attributes.
LOSS_CURVE = "loss_curve"  # [[seconds since fit began, server version, chief's batch loss], ...]
MODEL = "model"  # what identifies the model, its data and target (see `study_name`)
_PHASE = re.compile(r"phase_(\d+)")


def params_of(config: Config) -> dict[str, float]:
    return {"num_groups": config.num_groups, "learning_rate": config.learning_rate, "momentum": config.momentum}


def config_of(params: dict) -> Config:
    return Config(int(params["num_groups"]), float(params["learning_rate"]), float(params["momentum"]))


def words(config: Config) -> str:
    """How the tuner and the report name a configuration: "2 groups, momentum 0.6,
    learning rate 0.01"."""
    groups = f"{config.num_groups} group{'s' * (config.num_groups != 1)}"
    return f"{groups}, momentum {config.momentum:g}, learning rate {config.learning_rate:g}"


@dataclass(frozen=True)
class TrialRecord:
    """One trial's measurements and verdict: the user attributes of its Optuna trial."""

    phase: int
    steps: int
    updates: int
    seconds: float
    # From the phase's snapshot, or where the trial before ended where trials continue.
    probe_loss_start: float
    probe_loss_end: float
    time_to_target: float
    updates_to_target: float
    predicted_seconds_per_update: float
    measured_seconds_per_update: float
    mean_staleness: float
    measured_momentum: float
    diverged: bool = False
    pruned: bool = False
    # Cut short when `fit` ended; never reused.
    interrupted: bool = False

    @property
    def outcome(self) -> Outcome:
        return Outcome(self.time_to_target, self.diverged, self.pruned)

    def write(self, trial: optuna.trial.Trial) -> None:
        for key, value in dataclasses.asdict(self).items():
            trial.set_user_attr(key, value)

    @classmethod
    def read(cls, trial: optuna.trial.FrozenTrial) -> "TrialRecord | None":
        """The record of a trial that finished, or None (one still running, or written
        by another tool)."""
        names = {f.name for f in dataclasses.fields(cls)}
        attrs = {k: v for k, v in trial.user_attrs.items() if k in names}
        try:
            return cls(**attrs)
        except TypeError:
            return None


@dataclass(frozen=True)
class PhaseRecord:
    """What a tuning phase chose: the study attribute `phase_<index>`."""

    index: int
    config: Config
    tuning_seconds: float
    training_seconds: float
    # Measured by the phase's timing runs, by number of groups.
    seconds_per_update: dict[int, float] = field(default_factory=dict)

    def write(self, study: optuna.Study) -> None:
        value = params_of(self.config) | {
            "tuning_seconds": self.tuning_seconds,
            "training_seconds": self.training_seconds,
            "seconds_per_update": {str(g): s for g, s in self.seconds_per_update.items()},
        }
        study.set_user_attr(f"phase_{self.index}", value)

    @classmethod
    def read_all(cls, study: optuna.Study) -> list["PhaseRecord"]:
        phases = []
        for key, value in study.user_attrs.items():
            match = _PHASE.fullmatch(key)
            if match is None:
                continue
            measured = {int(g): float(s) for g, s in (value.get("seconds_per_update") or {}).items()}
            phases.append(cls(
                int(match[1]), config_of(value), float(value["tuning_seconds"]), float(value["training_seconds"]), measured,
            ))
        return sorted(phases, key=lambda phase: phase.index)


def finished_trial(study: optuna.Study, phase: int, config: Config) -> tuple[optuna.trial.FrozenTrial, TrialRecord] | None:
    """A trial of `config` in `phase` that an earlier run of the same study finished."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)):
        record = TrialRecord.read(trial)
        if record is None or record.phase != phase or record.interrupted or set(trial.params) != set(PARAMS):
            continue
        tried = config_of(trial.params)
        if (
            tried.num_groups == config.num_groups
            and math.isclose(tried.learning_rate, config.learning_rate, rel_tol=1e-9)
            and math.isclose(tried.momentum, config.momentum, abs_tol=1e-9)
        ):
            return trial, record
    return None
