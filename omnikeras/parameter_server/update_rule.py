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
    """Updates `weight` and `velocity` in place; `gradient` is used as scratch space.

    `velocity` may be None only while momentum is 0.
    """
    lr, mu = hyperparameters.learning_rate, hyperparameters.momentum
    np.multiply(gradient, weight.dtype.type(lr), out=gradient)
    if velocity is None:
        weight -= gradient
        return
    velocity *= weight.dtype.type(mu)
    velocity -= gradient
    if hyperparameters.nesterov:
        weight -= gradient
        np.multiply(velocity, weight.dtype.type(mu), out=gradient)
        weight += gradient
    else:
        weight += velocity
