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
from omnikeras.parameter_server.optimizers import base, fused
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
    """Adam's step size with both bias corrections, as Keras computes it: in the weight's
    dtype, one operation at a time, from its settings cast to it.

    In Python's floats, each result rounded to the dtype: a product, quotient, difference
    or root of float32 (or float16) values computed in float64 and rounded once is the one
    the dtype's own arithmetic gives, and Python's power of float64 rounded to float32 is
    TensorFlow's more often than NumPy's float32 power, which was up to 1e-4 off in the
    first steps for beta_2 = 0.9999. NumPy's scalar arithmetic under its error state, run
    cold between pushes, also took about 30 µs more of each push's bound (`bounds_after`:
    83 µs against 55 in a launched run of the main job's CNN). Where a bias correction is
    0 or a root's argument negative, the result is Inf or NaN as in the dtype's arithmetic,
    and `bounds_after` turns it down."""
    rounded = functools.partial(base.rounded, dtype=dtype)
    local_step = rounded(iteration + 1)
    beta_1_power = rounded(_power(rounded(beta_1), local_step))
    beta_2_power = rounded(_power(rounded(beta_2), local_step))
    root = math.sqrt(rounded(1 - beta_2_power)) if beta_2_power <= 1 else math.nan
    size = _quotient(rounded(rounded(learning_rate) * rounded(root)), rounded(1 - beta_1_power))
    return dtype.type(rounded(size))


def _power(base_value: float, exponent: float) -> float:
    try:
        return math.pow(base_value, exponent)
    except OverflowError:
        # `exponent` is a whole number: a negative base's odd powers are negative.
        return -math.inf if base_value < 0 and exponent % 2 else math.inf


def _quotient(numerator: float, denominator: float) -> float:
    """`numerator / denominator` as IEEE 754 divides: Inf or NaN where Python raises."""
    if denominator != 0:
        return numerator / denominator
    if numerator == 0 or math.isnan(numerator):
        return math.nan
    return math.copysign(math.inf, numerator) * math.copysign(1.0, denominator)


class AdamW(Adam):
    name = "AdamW"
