"""SGD with momentum, plain or Nesterov, applied in place on the server's weights.

The rule is Keras' `SGD`, so a model trained through the server follows the same
trajectory as one trained by `keras.optimizers.SGD` with the same settings:

    velocity = momentum * velocity - learning_rate * gradient
    weight  += velocity                                   (plain)
    weight  += momentum * velocity - learning_rate * gradient   (Nesterov)
"""

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg.blas

from omnikeras.parameter_server import parallel
from omnikeras.parameter_server.errors import InvalidArgument
from omnikeras.v1 import parameter_server_pb2 as pb


@dataclass(frozen=True)
class Hyperparameters:
    learning_rate: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise InvalidArgument(f"learning_rate must be a positive number, got {self.learning_rate}")
        # Asynchrony adds implicit momentum, so the explicit one may need to go below 0.
        if not (math.isfinite(self.momentum) and -1 < self.momentum < 1):
            raise InvalidArgument(f"momentum must lie in (-1, 1), got {self.momentum}")

    @classmethod
    def from_proto(cls, message: pb.Hyperparameters) -> "Hyperparameters":
        return cls(message.learning_rate, message.momentum, message.nesterov)

    def to_proto(self) -> pb.Hyperparameters:
        return pb.Hyperparameters(
            learning_rate=self.learning_rate, momentum=self.momentum, nesterov=self.nesterov
        )


def apply_update(
    weight: np.ndarray,
    velocity: np.ndarray | None,
    gradient: np.ndarray,
    hyperparameters: Hyperparameters,
) -> None:
    """Updates `weight` and `velocity` in place; `gradient` may be used as scratch space.

    `velocity` may be None only while momentum is 0.
    """
    lr, mu, nesterov = hyperparameters.learning_rate, hyperparameters.momentum, hyperparameters.nesterov
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
