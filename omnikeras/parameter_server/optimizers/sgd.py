"""SGD with momentum, plain or Nesterov, as `keras.optimizers.SGD` applies it:

    velocity = momentum * velocity - learning_rate * gradient
    weight  += velocity                                   (plain)
    weight  += momentum * velocity - learning_rate * gradient   (Nesterov)

The momentum buffer is created when a momentum is first in force.
"""

from typing import ClassVar

import numpy as np

from omnikeras.parameter_server import parallel
from omnikeras.parameter_server.optimizers.base import Bounds, MomentumForm, Optimizer, Slots, Step, blas_for


class SGD(Optimizer):
    name = "SGD"
    defaults = {"nesterov": 0.0}
    flags = frozenset({"nesterov"})
    momentum_setting = "momentum"
    momentum_form: ClassVar[MomentumForm] = "heavy ball"
    carries_bounds = True

    def slots(self, weight: np.ndarray, step: Step) -> Slots:
        return {"momentum": np.zeros_like(weight)} if step.momentum != 0 else {}

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        state = {slot: array.copy() for slot, array in slots.items()}
        updated = weight.copy()
        self.update_in_place(updated, gradient, state, step)
        return updated, state

    def bounds_after(self, before: Bounds, change: float, step: Step, dtype: np.dtype) -> Bounds:
        update = step.learning_rate * change
        if "momentum" not in before.slots and step.momentum == 0:
            return Bounds(before.weight + update, {})
        velocity = abs(step.momentum) * before.slots.get("momentum", 0.0) + update
        if self.flag("nesterov"):
            return Bounds(before.weight + abs(step.momentum) * velocity + update, {"momentum": velocity})
        return Bounds(before.weight + velocity, {"momentum": velocity})

    def update_in_place(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> None:
        if step.momentum != 0 and "momentum" not in slots:
            slots["momentum"] = np.zeros_like(weight)
        apply_update(weight, slots.get("momentum"), gradient, step.learning_rate, step.momentum, self.flag("nesterov"))


def apply_weight_decay(weight: np.ndarray, factor: float) -> None:
    """Scales `weight` in place by 1 - `factor` (the learning rate times the decay)."""
    blas = blas_for(weight)
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
    blas = blas_for(weight)
    if blas is None:
        _apply_with_numpy(weight, velocity, gradient, lr, mu, nesterov)
        return
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
