"""The objective of every decision: time to target = seconds per update x updates."""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from omnikeras.convergence.statistical import updates_to_target


class HardwareEfficiency(Protocol):
    """Predicts seconds per update for a number of groups, and learns from measurements."""

    def seconds_per_update(self, num_groups: int) -> float: ...

    def observe(self, num_groups: int, measured_seconds_per_update: float) -> float: ...

    def saturation_groups(self, min_gain: float = 0.10) -> int: ...


@dataclass(frozen=True)
class TrialMeasurement:
    """What a short trial measured.

    Args:
        num_groups: The number of groups it ran with.
        updates: The server's update count at each loss measurement.
        losses: The training loss at each of those points.
        seconds: Wall time from the first to the last measurement.
    """

    num_groups: int
    updates: Sequence[int]
    losses: Sequence[float]
    seconds: float

    @property
    def seconds_per_update(self) -> float:
        applied = self.updates[-1] - self.updates[0] if len(self.updates) > 1 else 0
        return self.seconds / applied if applied > 0 else math.inf


@dataclass(frozen=True)
class Estimate:
    predicted_seconds_per_update: float
    measured_seconds_per_update: float
    updates_to_target: float

    @property
    def time_to_target(self) -> float:
        """Seconds until the target loss, at the measured pace."""
        if self.updates_to_target == 0:
            return 0.0
        return self.measured_seconds_per_update * self.updates_to_target


class ConvergenceTimeModel:
    """Turns a trial's measurements into its predicted time to the target loss.

    Args:
        target_loss: The training loss to reach.
        hardware: Predicts seconds per update (`HardwareModel` from device profiles, or
            `MeasuredHardwareModel`); each trial's measurement corrects it.

    Example:

    >>> from omnikeras.convergence import MeasuredHardwareModel
    >>> model = ConvergenceTimeModel(0.5, MeasuredHardwareModel(num_workers=4))
    >>> trial = TrialMeasurement(1, updates=[0, 10, 20], losses=[2.0, 1.0, 0.5], seconds=4.0)
    >>> round(model.estimate(trial).time_to_target, 6)
    0.0
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
            updates_to_target=updates_to_target(trial.updates, trial.losses, self.target_loss),
        )
