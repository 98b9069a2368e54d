"""Keras' built-in learning-rate schedules, evaluated on the server at its own iteration
count, in plain Python: the server does not import TensorFlow.

A schedule travels as Keras describes it: its class name and `get_config()`. Each formula
here is the one of `keras.optimizers.schedules` of that name.

    >>> schedule = LearningRateSchedule("ExponentialDecay", {"initial_learning_rate": 0.1,
    ...     "decay_steps": 10, "decay_rate": 0.5, "staircase": False})
    >>> schedule(20)
    0.025
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omnikeras.parameter_server.errors import InvalidArgument
from omnikeras.parameter_server.keras_config import config_from_json, config_json
from omnikeras.v1 import parameter_server_pb2 as pb


def _exponential(c: Mapping[str, Any], step: float) -> float:
    p = step / c["decay_steps"]
    if c["staircase"]:
        p = math.floor(p)
    return c["initial_learning_rate"] * c["decay_rate"] ** p


def _piecewise_constant(c: Mapping[str, Any], step: float) -> float:
    boundaries, values = c["boundaries"], c["values"]
    for boundary, value in zip(boundaries, values):
        if step <= boundary:
            return value
    return values[-1]


def _polynomial(c: Mapping[str, Any], step: float) -> float:
    decay_steps = c["decay_steps"]
    if c["cycle"]:
        decay_steps *= 1.0 if step == 0 else math.ceil(step / c["decay_steps"])
    else:
        step = min(step, decay_steps)
    p = step / decay_steps
    end = c["end_learning_rate"]
    return (c["initial_learning_rate"] - end) * (1 - p) ** c["power"] + end


def _inverse_time(c: Mapping[str, Any], step: float) -> float:
    p = step / c["decay_steps"]
    if c["staircase"]:
        p = math.floor(p)
    return c["initial_learning_rate"] / (1 + c["decay_rate"] * p)


def _cosine(c: Mapping[str, Any], step: float) -> float:
    initial, decay_steps, alpha = c["initial_learning_rate"], c["decay_steps"], c["alpha"]

    def decayed(step: float, decay_from: float) -> float:
        cosine = 0.5 * (1.0 + math.cos(math.pi * step / decay_steps))
        return decay_from * ((1 - alpha) * cosine + alpha)

    target = c.get("warmup_target")
    if target is None:
        return decayed(min(step, decay_steps), initial)
    warmup_steps = c["warmup_steps"]
    step = min(step, decay_steps + warmup_steps)
    if step < warmup_steps:
        return (target - initial) * step / warmup_steps + initial
    return decayed(step - warmup_steps, target)


def _cosine_restarts(c: Mapping[str, Any], step: float) -> float:
    fraction = step / c["first_decay_steps"]
    t_mul, m_mul, alpha = c["t_mul"], c["m_mul"], c["alpha"]
    if t_mul == 1.0:
        restart = math.floor(fraction)
        fraction -= restart
    else:
        restart = math.floor(math.log(1.0 - fraction * (1.0 - t_mul)) / math.log(t_mul))
        fraction = (fraction - (1.0 - t_mul**restart) / (1.0 - t_mul)) / t_mul**restart
    cosine = 0.5 * m_mul**restart * (1.0 + math.cos(math.pi * fraction))
    return c["initial_learning_rate"] * ((1 - alpha) * cosine + alpha)


FORMULAS: dict[str, Callable[[Mapping[str, Any], float], float]] = {
    "ExponentialDecay": _exponential,
    "PiecewiseConstantDecay": _piecewise_constant,
    "PolynomialDecay": _polynomial,
    "InverseTimeDecay": _inverse_time,
    "CosineDecay": _cosine,
    "CosineDecayRestarts": _cosine_restarts,
}


@dataclass(frozen=True)
class LearningRateSchedule:
    """One of Keras' built-in schedules, by class name and configuration."""

    name: str
    config: Mapping[str, Any] = field(hash=False)

    def __post_init__(self) -> None:
        if self.name not in FORMULAS:
            raise InvalidArgument(
                f"learning-rate schedule {self.name!r} is not one of Keras' built-in schedules "
                f"({', '.join(FORMULAS)})"
            )
        try:
            self(0)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
            raise InvalidArgument(f"{self.name} configuration {dict(self.config)} is not valid: {error!r}") from None

    def __call__(self, iteration: int) -> float:
        return float(FORMULAS[self.name](self.config, float(iteration)))

    @classmethod
    def from_proto(cls, message: pb.LearningRateSchedule) -> "LearningRateSchedule":
        return cls(message.name, config_from_json(message.config_json, "learning-rate schedule"))

    def to_proto(self) -> pb.LearningRateSchedule:
        return pb.LearningRateSchedule(name=self.name, config_json=config_json(self.config))
