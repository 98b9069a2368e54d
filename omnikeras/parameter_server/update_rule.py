"""SGD with momentum, plain or Nesterov, applied in place on the server's weights.

The rule is Keras' `SGD`, so a model trained through the server follows the same
trajectory as one trained by `keras.optimizers.SGD` with the same settings:

    weight  *= 1 - learning_rate * weight_decay           (when weight decay is set)
    velocity = momentum * velocity - learning_rate * gradient
    weight  += velocity                                   (plain)
    weight  += momentum * velocity - learning_rate * gradient   (Nesterov)

with the learning rate of the schedule at the server's iteration count when one is set.
A statistic (a variable the model trains itself) takes the change a worker pushed:

    weight  += change
"""

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg.blas

from omnikeras.parameter_server import parallel
from omnikeras.parameter_server.errors import InvalidArgument
from omnikeras.parameter_server.schedules import LearningRateSchedule
from omnikeras.v1 import parameter_server_pb2 as pb


@dataclass(frozen=True)
class Hyperparameters:
    """The server's update rule: Keras SGD's settings.

    Args:
        learning_rate: The rate while no schedule is set.
        momentum: Explicit momentum; asynchrony adds its own.
        nesterov: Nesterov momentum.
        learning_rate_schedule: A Keras built-in schedule, evaluated at the server's
            iteration count (the updates it has applied); replaces `learning_rate`.
        weight_decay: Keras' decoupled weight decay, scaled by the learning rate.
        no_weight_decay: Names of the variables weight decay leaves alone.
        statistics: Names of the variables the model trains itself (batch-normalization
            statistics): their pushes are changes, added as they come, averaged over the
            group's members.
        compensate_asynchrony: With more than one group, the momentum and learning rate
            in force are steered so that the updates' total momentum and effective step
            are these (see `compensation`). Defaults to True; False applies them as
            they are.
    """

    learning_rate: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    learning_rate_schedule: LearningRateSchedule | None = None
    weight_decay: float = 0.0
    no_weight_decay: frozenset[str] = frozenset()
    statistics: frozenset[str] = frozenset()
    compensate_asynchrony: bool = True

    def __post_init__(self) -> None:
        if not _positive_in_float32(self.learning_rate):
            raise InvalidArgument(f"learning_rate must be a positive number within float32's range, got {self.learning_rate}")
        # Asynchrony adds implicit momentum, so the explicit one may need to go below 0.
        if not (math.isfinite(self.momentum) and -1 < self.momentum < 1):
            raise InvalidArgument(f"momentum must lie in (-1, 1), got {self.momentum}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise InvalidArgument(f"weight_decay must be 0 or positive, got {self.weight_decay}")

    def learning_rate_at(self, iteration: int) -> float:
        if self.learning_rate_schedule is None:
            return self.learning_rate
        return self.learning_rate_schedule(iteration)

    def decays(self, name: str) -> bool:
        return self.weight_decay > 0 and name not in self.no_weight_decay and name not in self.statistics

    @classmethod
    def from_proto(cls, message: pb.Hyperparameters) -> "Hyperparameters":
        schedule = None
        if message.HasField("learning_rate_schedule"):
            schedule = LearningRateSchedule.from_proto(message.learning_rate_schedule)
        return cls(
            message.learning_rate,
            message.momentum,
            message.nesterov,
            schedule,
            message.weight_decay,
            frozenset(message.no_weight_decay),
            frozenset(message.statistics),
            message.compensate_asynchrony,
        )

    def to_proto(self) -> pb.Hyperparameters:
        return pb.Hyperparameters(
            learning_rate=self.learning_rate,
            momentum=self.momentum,
            nesterov=self.nesterov,
            learning_rate_schedule=self.learning_rate_schedule.to_proto() if self.learning_rate_schedule else None,
            weight_decay=self.weight_decay,
            no_weight_decay=sorted(self.no_weight_decay),
            statistics=sorted(self.statistics),
            compensate_asynchrony=self.compensate_asynchrony,
        )


def apply_weight_decay(weight: np.ndarray, factor: float) -> None:
    """Scales `weight` in place by 1 - `factor` (the learning rate times the decay)."""
    blas = _BLAS.get(weight.dtype) if weight.dtype.isnative else None
    if blas is None:
        weight -= weight * weight.dtype.type(factor)
        return
    blas[1](1.0 - factor, weight.reshape(-1))


def apply_update(
    weight: np.ndarray,
    velocity: np.ndarray | None,
    gradient: np.ndarray,
    learning_rate: float,
    momentum: float = 0.0,
    nesterov: bool = False,
) -> None:
    """Updates `weight` and `velocity` in place; `gradient` may be used as scratch space.

    `velocity` may be None only while momentum is 0.
    """
    lr, mu = learning_rate, momentum
    arrays = (weight, gradient) if velocity is None else (weight, gradient, velocity)
    if parallel.worth_splitting(*arrays):
        parallel.split_pass(lambda w, g, v=None: _apply_with_numpy(w, v, g, lr, mu, nesterov), *arrays)
        return
    blas = _BLAS.get(weight.dtype) if weight.dtype.isnative else None
    if blas is None:
        _apply_with_numpy(weight, velocity, gradient, lr, mu, nesterov)
        return
    # One pass over the arrays per BLAS call, against two for most NumPy expressions of
    # the same step (a temporary, then the operation): the update is memory-bound.
    axpy, scal = blas
    w, g = weight.reshape(-1), gradient.reshape(-1)
    if velocity is None:
        axpy(g, w, a=-lr)
        return
    v = velocity.reshape(-1)
    scal(mu, v)
    axpy(g, v, a=-lr)
    if nesterov:
        axpy(v, w, a=mu)
        axpy(g, w, a=-lr)
    else:
        axpy(v, w, a=1.0)


_BLAS = {
    np.dtype(np.float32): (scipy.linalg.blas.saxpy, scipy.linalg.blas.sscal),
    np.dtype(np.float64): (scipy.linalg.blas.daxpy, scipy.linalg.blas.dscal),
}


def _apply_with_numpy(
    weight: np.ndarray, velocity: np.ndarray | None, gradient: np.ndarray, lr: float, mu: float, nesterov: bool
) -> None:
    np.multiply(gradient, weight.dtype.type(lr), out=gradient)
    if velocity is None:
        weight -= gradient
        return
    velocity *= weight.dtype.type(mu)
    velocity -= gradient
    if nesterov:
        weight -= gradient
        np.multiply(velocity, weight.dtype.type(mu), out=gradient)
        weight += gradient
    else:
        weight += velocity


def _positive_in_float32(value: float) -> bool:
    """Positive and finite also as a float32: a rate that overflows a float32 model's
    update poisons its weights."""
    with np.errstate(over="ignore"):
        narrowed = np.float32(value)
    return math.isfinite(value) and bool(np.isfinite(narrowed) and narrowed > 0)
