"""RMSprop, plain or centered, with or without momentum, as `keras.optimizers.RMSprop`
applies it:

    v = rho * v + (1 - rho) * gradient ** 2
    a = rho * a + (1 - rho) * gradient                  (centered)
    increment = learning_rate * gradient / sqrt(v - a ** 2 + epsilon)    (plain: v + epsilon)
    p = momentum * p + increment;  weight -= p          (with momentum; else weight -= increment)
"""

from typing import ClassVar

import numpy as np

from omnikeras.parameter_server.optimizers.base import MomentumForm, Optimizer, Slots, Step, cast


class RMSprop(Optimizer):
    name = "RMSprop"
    defaults = {"rho": 0.9, "epsilon": 1e-7, "centered": 0.0}
    flags = frozenset({"centered"})
    momentum_setting = "momentum"
    momentum_form: ClassVar[MomentumForm] = "heavy ball"

    def slots(self, weight: np.ndarray, step: Step) -> Slots:
        names = ["velocity"]
        if step.momentum != 0:
            names.append("momentum")
        if self.flag("centered"):
            names.append("average_gradient")
        return {name: np.zeros_like(weight) for name in names}

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        rho, epsilon = self.settings["rho"], self.settings["epsilon"]
        # A momentum buffer stays while compensation puts a momentum of 0 in force.
        state = dict(slots)
        velocity = state["velocity"] = rho * slots["velocity"] + (1 - rho) * np.square(gradient)
        if self.flag("centered"):
            average = state["average_gradient"] = rho * slots["average_gradient"] + (1 - rho) * gradient
            denominator = velocity - np.square(average) + epsilon
        else:
            denominator = velocity + epsilon
        increment = (cast(weight, step.learning_rate) * gradient) / np.sqrt(denominator)
        if step.momentum == 0:
            return weight - increment, state
        momentum = state["momentum"] = step.momentum * slots.get("momentum", np.zeros_like(weight)) + increment
        return weight - momentum, state
