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

from omnikeras.parameter_server import parallel
from omnikeras.parameter_server.optimizers import fused
from omnikeras.parameter_server.optimizers.base import Bounds, MomentumForm, Optimizer, Slots, Step, cast


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
        names = ("momentum", "velocity", "velocity_hat") if self.flag("amsgrad") else ("momentum", "velocity")
        arrays = [weight, gradient, *(slots[name] for name in names)]
        if not fused.applies(*arrays):
            updated, state = self.update(weight, gradient, slots, step)
            np.copyto(weight, updated)
            slots.update(state)
            return
        # As Keras: `1 - beta` in Python, then in the variable's dtype.
        settings = [
            *(cast(weight, value) for value in (1 - step.momentum, 1 - self.settings["beta_2"], self.settings["epsilon"])),
            self._alpha(weight.dtype, step),
        ]
        kernel = fused.adam_amsgrad if self.flag("amsgrad") else fused.adam

        def run(*parts: np.ndarray) -> None:
            kernel(*parts, *settings)

        if parallel.worth_splitting(*arrays):
            parallel.split_pass(run, *arrays)
        else:
            run(*(array.reshape(-1) for array in arrays))

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
