"""The convergence-time model: time per update x updates to reach the target loss."""

from omnikeras.convergence.hardware import HardwareModel
from omnikeras.convergence.measured_hardware import MeasuredHardwareModel
from omnikeras.convergence.momentum import implicit_momentum, measured_momentum
from omnikeras.convergence.statistical import updates_to_target
from omnikeras.convergence.time_to_target import (
    ConvergenceTimeModel,
    Estimate,
    HardwareEfficiency,
    TrialMeasurement,
)

__all__ = [
    "ConvergenceTimeModel",
    "Estimate",
    "HardwareEfficiency",
    "HardwareModel",
    "MeasuredHardwareModel",
    "TrialMeasurement",
    "implicit_momentum",
    "measured_momentum",
    "updates_to_target",
]
