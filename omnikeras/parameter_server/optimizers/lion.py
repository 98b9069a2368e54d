"""Lion, as `keras.optimizers.Lion` applies it:

    weight -= learning_rate * sign(beta_1 * m + (1 - beta_1) * gradient)
    m = beta_2 * m + (1 - beta_2) * gradient
"""

from typing import ClassVar

import numpy as np

from omnikeras.parameter_server.optimizers.base import MomentumForm, Optimizer, Slots, Step, cast


class Lion(Optimizer):
    name = "Lion"
    defaults = {"beta_2": 0.99}
    momentum_setting = "beta_1"
    momentum_form: ClassVar[MomentumForm] = "average"
    slot_names = ("momentum",)

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        one = cast(weight, 1.0)
        beta_1, beta_2 = cast(weight, step.momentum), cast(weight, self.settings["beta_2"])
        m = slots["momentum"]
        updated = weight - cast(weight, step.learning_rate) * np.sign(m * beta_1 + gradient * (one - beta_1))
        return updated, {"momentum": m * beta_2 + gradient * (one - beta_2)}
