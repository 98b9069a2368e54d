"""Adam, as `keras.optimizers.Adam` applies it (AdamW is the same update; Keras' base
applies the weight decay both take before it):

    alpha = learning_rate * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)    (t = iteration + 1)
    m += (gradient - m) * (1 - beta_1)
    v += (gradient ** 2 - v) * (1 - beta_2)
    v_hat = max(v_hat, v)                                   (amsgrad; v_hat replaces v)
    weight -= m * alpha / (sqrt(v) + epsilon)

Its `applied_rate`, `alpha / (sqrt(v) + epsilon)`, is what the momentum meter divides an
update by: the update over it is `m`, a combination of gradients.
"""

import functools
import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from omnikeras.parameter_server.optimizers.base import Bounds, MomentumForm, Optimizer, Slots, Step, blas_for, cast


class Adam(Optimizer):
    name = "Adam"
    defaults = {"beta_2": 0.999, "epsilon": 1e-7, "amsgrad": 0.0}
    flags = frozenset({"amsgrad"})
    momentum_setting = "beta_1"
    momentum_form: ClassVar[MomentumForm] = "average"
    carries_bounds = True

    def slots(self, weight: np.ndarray, step: Step) -> Slots:
        names = ("momentum", "velocity", "velocity_hat") if self.flag("amsgrad") else ("momentum", "velocity")
        return {name: np.zeros_like(weight) for name in names}

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        beta_1, beta_2 = step.momentum, self.settings["beta_2"]
        alpha = self._alpha(weight.dtype, step)
        m, v = slots["momentum"], slots["velocity"]
        m = m + (gradient - m) * (1 - beta_1)
        v = v + (np.square(gradient) - v) * (1 - beta_2)
        state = {"momentum": m, "velocity": v}
        if self.flag("amsgrad"):
            v = state["velocity_hat"] = np.maximum(slots["velocity_hat"], v)
        return weight - (m * alpha) / (np.sqrt(v) + self.settings["epsilon"]), state

    def bounds_after(self, before: Bounds, change: float, step: Step, dtype: np.dtype) -> Bounds | None:
        epsilon = self.settings["epsilon"]
        alpha = abs(float(self._alpha(dtype, step)))
        if epsilon <= 0 or not math.isfinite(alpha):
            # 0 / 0 where a moment and its root are 0; a bias correction that rounds to 0.
            return None
        beta_1, beta_2 = step.momentum, self.settings["beta_2"]
        m = abs(beta_1) * before.slots.get("momentum", 0.0) + abs(1 - beta_1) * change
        v = abs(beta_2) * before.slots.get("velocity", 0.0) + abs(1 - beta_2) * change * change
        slots = {"momentum": m, "velocity": v}
        if self.flag("amsgrad"):
            slots["velocity_hat"] = max(before.slots.get("velocity_hat", 0.0), v)
        # The root in the denominator is at least 0: the step is at most alpha * m / epsilon.
        return Bounds(before.weight + alpha * m / epsilon, slots)

    def update_in_place(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> None:
        blas = blas_for(weight)
        if blas is None:
            updated, state = self.update(weight, gradient, slots, step)
            np.copyto(weight, updated)
            slots.update(state)
            return
        # The arithmetic of `update` in BLAS passes over the arrays, with the gradient as
        # the only scratch space: 9 passes against 12 and three new arrays.
        axpy, scal = blas
        beta_1, beta_2 = step.momentum, self.settings["beta_2"]
        w, g = weight.reshape(-1), gradient.reshape(-1)
        m, v = slots["momentum"].reshape(-1), slots["velocity"].reshape(-1)
        scal(beta_1, m)
        axpy(g, m, a=1 - beta_1)
        np.square(g, out=g)
        scal(beta_2, v)
        axpy(g, v, a=1 - beta_2)
        if self.flag("amsgrad"):
            v = np.maximum(slots["velocity_hat"].reshape(-1), v, out=slots["velocity_hat"].reshape(-1))
        np.sqrt(v, out=g)
        g += cast(weight, self.settings["epsilon"])
        np.divide(m, g, out=g)
        axpy(g, w, a=-self._alpha(weight.dtype, step))

    def rate_slots(self) -> tuple[str, ...]:
        return ("velocity_hat",) if self.flag("amsgrad") else ("velocity",)

    def applied_rate(self, step: Step, slots: Mapping[str, np.ndarray]) -> np.ndarray:
        # The update is `m` at this rate, and `m` an average of gradients: over it, an
        # update resolves into gradients as SGD's does over its learning rate.
        v = slots[self.rate_slots()[0]]
        return self._alpha(v.dtype, step) / (np.sqrt(v) + cast(v, self.settings["epsilon"]))

    def _alpha(self, dtype: np.dtype, step: Step) -> np.floating:
        return _step_size(dtype, step.learning_rate, step.momentum, self.settings["beta_2"], step.iteration)


# Every variable of an update asks for it twice (its bound, its update): one computation.
@functools.lru_cache(maxsize=8)
def _step_size(dtype: np.dtype, learning_rate: float, beta_1: float, beta_2: float, iteration: int) -> np.floating:
    """Adam's step size with both bias corrections, computed in the weight's dtype."""
    local_step = dtype.type(iteration + 1)
    # An overflow or a 0 / 0 gives Inf or NaN, which `bounds_after` turns down.
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return (
            dtype.type(learning_rate)
            * np.sqrt(1 - np.power(dtype.type(beta_2), local_step))
            / (1 - np.power(dtype.type(beta_1), local_step))
        )


class AdamW(Adam):
    name = "AdamW"
