"""Adam, as `keras.optimizers.Adam` applies it (AdamW is the same update; Keras' base
applies the weight decay both take before it):

    alpha = learning_rate * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)    (t = iteration + 1)
    m += (gradient - m) * (1 - beta_1)
    v += (gradient ** 2 - v) * (1 - beta_2)
    v_hat = max(v_hat, v)                                   (amsgrad; v_hat replaces v)
    weight -= m * alpha / (sqrt(v) + epsilon)
"""

from typing import ClassVar

import numpy as np

from omnikeras.parameter_server.optimizers.base import MomentumForm, Optimizer, Slots, Step, cast


class Adam(Optimizer):
    name = "Adam"
    defaults = {"beta_2": 0.999, "epsilon": 1e-7, "amsgrad": 0.0}
    flags = frozenset({"amsgrad"})
    momentum_setting = "beta_1"
    momentum_form: ClassVar[MomentumForm] = "average"

    def slots(self, weight: np.ndarray, step: Step) -> Slots:
        names = ("momentum", "velocity", "velocity_hat") if self.flag("amsgrad") else ("momentum", "velocity")
        return {name: np.zeros_like(weight) for name in names}

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        beta_1, beta_2 = step.momentum, self.settings["beta_2"]
        local_step = cast(weight, step.iteration + 1)
        alpha = (
            cast(weight, step.learning_rate)
            * np.sqrt(1 - np.power(cast(weight, beta_2), local_step))
            / (1 - np.power(cast(weight, beta_1), local_step))
        )
        m, v = slots["momentum"], slots["velocity"]
        m = m + (gradient - m) * (1 - beta_1)
        v = v + (np.square(gradient) - v) * (1 - beta_2)
        state = {"momentum": m, "velocity": v}
        if self.flag("amsgrad"):
            v = state["velocity_hat"] = np.maximum(slots["velocity_hat"], v)
        return weight - (m * alpha) / (np.sqrt(v) + self.settings["epsilon"]), state


class AdamW(Adam):
    name = "AdamW"
