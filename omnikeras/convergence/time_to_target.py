"""The objective of every decision: time to target = seconds per update x updates."""

import math
from dataclasses import dataclass
from typing import Protocol

from omnikeras.convergence.statistical import updates_to_target


class HardwareEfficiency(Protocol):
    """Predicts seconds per update for a number of groups, and learns from measurements."""

    def seconds_per_update(self, num_groups: int) -> float: ...

    def observe(self, num_groups: int, measured_seconds_per_update: float) -> float: ...


@dataclass(frozen=True)
class TrialMeasurement:
    """What a short trial measured, from the tuning phase's common snapshot.

    Args:
        num_groups: The number of groups it ran with.
        updates: Updates the server applied during the trial.
        seconds: Wall time from the restore of the snapshot to the trial's end.
        start_loss: The probe batch's loss at the snapshot.
        end_loss: The probe batch's loss of the trial's final weights.
    """

    num_groups: int
    updates: int
    seconds: float
    start_loss: float
    end_loss: float

    @property
    def seconds_per_update(self) -> float:
        return self.seconds / self.updates if self.updates > 0 else math.inf


@dataclass(frozen=True)
class Estimate:
    predicted_seconds_per_update: float
    measured_seconds_per_update: float
    # After the trial.
    updates_to_target: float
    trial_seconds: float

    @property
    def time_to_target(self) -> float:
        """Seconds from the common snapshot until the target loss: the trial's own time,
        then its remaining updates at the measured pace (less, when the trial went past
        the target)."""
        return self.trial_seconds + self.measured_seconds_per_update * self.updates_to_target


class ConvergenceTimeModel:
    """Turns a trial's measurements into its predicted time to the target loss.

    Args:
        target_loss: The training loss to reach.
        hardware: Predicts seconds per update (`HardwareModel` from device profiles, or
            `MeasuredHardwareModel`); each trial's measurement corrects it.

    Example:

    >>> from omnikeras.convergence import MeasuredHardwareModel
    >>> model = ConvergenceTimeModel(0.25, MeasuredHardwareModel(num_workers=4))
    >>> trial = TrialMeasurement(1, updates=10, seconds=4.0, start_loss=2.0, end_loss=1.0)
    >>> round(model.estimate(trial).time_to_target, 6)
    12.0
    """

    def __init__(self, target_loss: float, hardware: HardwareEfficiency) -> None:
        if target_loss <= 0:
            raise ValueError(f"target_loss must be positive, got {target_loss}")
        self.target_loss = target_loss
        self.hardware = hardware

    def estimate(self, trial: TrialMeasurement) -> Estimate:
        measured = trial.seconds_per_update
        predicted = measured
        if math.isfinite(measured):
            # What the hardware model predicted before it learnt from this measurement.
            predicted = measured * (1 + self.hardware.observe(trial.num_groups, measured))
        return Estimate(
            predicted_seconds_per_update=predicted,
            measured_seconds_per_update=measured,
            updates_to_target=updates_to_target(trial.start_loss, trial.end_loss, trial.updates, self.target_loss),
            trial_seconds=trial.seconds,
        )
