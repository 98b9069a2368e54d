"""Adadelta, as `keras.optimizers.Adadelta` applies it:

    g2 = rho * g2 + (1 - rho) * gradient ** 2
    delta = -sqrt(d2 + epsilon) * gradient / sqrt(g2 + epsilon)
    d2 = rho * d2 + (1 - rho) * delta ** 2
    weight += learning_rate * delta
"""

import numpy as np

from omnikeras.parameter_server.optimizers.base import Optimizer, Slots, Step, cast


class Adadelta(Optimizer):
    name = "Adadelta"
    defaults = {"rho": 0.95, "epsilon": 1e-7}
    slot_names = ("accumulated_grad", "accumulated_delta_var")

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        rho, epsilon = self.settings["rho"], self.settings["epsilon"]
        deltas = slots["accumulated_delta_var"]
        grads = rho * slots["accumulated_grad"] + (1 - rho) * np.square(gradient)
        delta = -((np.sqrt(deltas + epsilon) * gradient) / np.sqrt(grads + epsilon))
        deltas = rho * deltas + (1 - rho) * np.square(delta)
        updated = weight + cast(weight, step.learning_rate) * delta
        return updated, {"accumulated_grad": grads, "accumulated_delta_var": deltas}
