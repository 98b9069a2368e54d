"""Studies shaped like the ones OmnivoreCallback leaves, written with Optuna directly
through the tuner's records."""

import dataclasses
import math

import optuna

from omnikeras.tuner.records import PARAMS as DISTRIBUTIONS
from omnikeras.tuner.records import TrialRecord

# (phase, num_groups, learning_rate, momentum, state, time_to_target, predicted spu, measured spu)
TRIALS = [
    (0, 1, 0.1, 0.9, "complete", 120.0, 0.020, 0.022),
    (0, 1, 0.01, 0.9, "complete", 90.0, 0.020, 0.021),
    (0, 1, 0.001, 0.9, "pruned", math.inf, 0.020, 0.019),
    (0, 4, 0.01, 0.6, "complete", 45.0, 0.008, 0.009),
    (0, 4, 0.1, 0.9, "diverged", math.inf, 0.008, math.nan),
    (1, 4, 0.01, 0.3, "complete", 40.0, 0.008, 0.0085),
    (1, 4, 0.001, 0.3, "complete", 60.0, 0.008, 0.0082),
]
PHASES = {
    "phase_0": {"num_groups": 4, "learning_rate": 0.01, "momentum": 0.6, "tuning_seconds": 12.5, "training_seconds": 112.5},
    "phase_1": {"num_groups": 4, "learning_rate": 0.01, "momentum": 0.3, "tuning_seconds": 8.0, "training_seconds": 72.0},
}


def record(storage: str | optuna.storages.BaseStorage, study_name: str = "omnivore", trials: list = TRIALS) -> None:
    """Writes `trials` and, for a study of more than one trial, `PHASES` and a loss curve."""
    study = optuna.create_study(study_name=study_name, storage=storage, direction="minimize")
    for phase, groups, learning_rate, momentum, outcome, time_to_target, predicted, measured in trials:
        diverged = outcome == "diverged"
        steps = range(5, 25 if diverged else 45, 5)
        study.add_trial(
            optuna.trial.create_trial(
                params={"num_groups": groups, "learning_rate": learning_rate, "momentum": momentum},
                distributions=DISTRIBUTIONS,
                state=optuna.trial.TrialState.COMPLETE if outcome == "complete" else optuna.trial.TrialState.PRUNED,
                value=time_to_target if outcome == "complete" else None,
                intermediate_values={step: 2.0 / (1 + 0.02 * step * learning_rate * 10) for step in steps if not diverged or step < 15},
                user_attrs=dataclasses.asdict(TrialRecord(
                    phase=phase,
                    steps=40,
                    updates=40 * groups,
                    seconds=40 * groups * measured if math.isfinite(measured) else math.nan,
                    probe_loss_start=2.3,
                    probe_loss_end=math.nan if diverged else 1.2,
                    time_to_target=time_to_target,
                    updates_to_target=time_to_target / measured if math.isfinite(time_to_target) else math.inf,
                    predicted_seconds_per_update=predicted,
                    measured_seconds_per_update=measured,
                    mean_staleness=(groups - 1) / 2,
                    measured_momentum=1 - 1 / groups,
                    diverged=diverged,
                    pruned=outcome == "pruned",
                )),
            )
        )
    if len(trials) > 1:
        for key, value in PHASES.items():
            study.set_user_attr(key, value)
        study.set_user_attr("loss_curve", [[0.5 * i, 10 * i, 2.3 * math.exp(-0.01 * i)] for i in range(400)])

