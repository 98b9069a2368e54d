"""Adamax, as `keras.optimizers.Adamax` applies it:

    m += (gradient - m) * (1 - beta_1)
    u  = max(beta_2 * u, |gradient|)
    weight -= learning_rate * m / ((1 - beta_1 ** t) * (u + epsilon))     (t = iteration + 1)
"""

from typing import ClassVar

import numpy as np

from omnikeras.parameter_server.optimizers.base import MomentumForm, Optimizer, Slots, Step, cast


class Adamax(Optimizer):
    name = "Adamax"
    defaults = {"beta_2": 0.999, "epsilon": 1e-7}
    momentum_setting = "beta_1"
    momentum_form: ClassVar[MomentumForm] = "average"
    slot_names = ("momentum", "norm")

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        beta_1 = step.momentum
        beta_1_power = np.power(cast(weight, beta_1), cast(weight, step.iteration + 1))
        m, u = slots["momentum"], slots["norm"]
        m = m + (gradient - m) * (1 - beta_1)
        u = np.maximum(u * self.settings["beta_2"], np.abs(gradient))
        updated = weight - (cast(weight, step.learning_rate) * m) / ((1 - beta_1_power) * (u + self.settings["epsilon"]))
        return updated, {"momentum": m, "norm": u}
