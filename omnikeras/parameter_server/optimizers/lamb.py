"""Lamb, as `keras.optimizers.Lamb` applies it: Adam's step, scaled per variable by the
ratio of the weight's norm to the step's (t = iteration + 1):

    m += (gradient - m) * (1 - beta_1)
    v += (gradient ** 2 - v) * (1 - beta_2)
    update = (m / (1 - beta_1 ** t)) / (sqrt(v / (1 - beta_2 ** t)) + epsilon)
    ratio = |weight| / |update|     (1 where either norm is 0)
    weight -= ratio * learning_rate * update
"""

from typing import ClassVar

import numpy as np

from omnikeras.parameter_server.optimizers.base import MomentumForm, Optimizer, Slots, Step, cast


class Lamb(Optimizer):
    name = "Lamb"
    defaults = {"beta_2": 0.999, "epsilon": 1e-7}
    momentum_setting = "beta_1"
    momentum_form: ClassVar[MomentumForm] = "average"
    slot_names = ("momentum", "velocity")

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        beta_1, beta_2 = step.momentum, self.settings["beta_2"]
        local_step = cast(weight, step.iteration + 1)
        beta_1_power = np.power(cast(weight, beta_1), local_step)
        beta_2_power = np.power(cast(weight, beta_2), local_step)
        m, v = slots["momentum"], slots["velocity"]
        m = m + (gradient - m) * (1 - beta_1)
        v = v + (np.square(gradient) - v) * (1 - beta_2)
        update = (m / (1.0 - beta_1_power)) / (np.sqrt(v / (1.0 - beta_2_power)) + self.settings["epsilon"])
        weight_norm = np.sqrt(np.sum(np.square(weight)))
        update_norm = np.sqrt(np.sum(np.square(update)))
        ratio = weight_norm / update_norm if weight_norm > 0 and update_norm > 0 else cast(weight, 1.0)
        return weight - ratio * cast(weight, step.learning_rate) * update, {"momentum": m, "velocity": v}
