"""Adagrad, as `keras.optimizers.Adagrad` applies it:

    accumulator += gradient ** 2          (starting at `initial_accumulator_value`)
    weight -= learning_rate * gradient / sqrt(accumulator + epsilon)
"""

import numpy as np

from omnikeras.parameter_server.optimizers.base import Optimizer, Slots, Step, cast


class Adagrad(Optimizer):
    name = "Adagrad"
    defaults = {"initial_accumulator_value": 0.1, "epsilon": 1e-7}

    def slots(self, weight: np.ndarray, step: Step) -> Slots:
        return {"accumulator": np.full_like(weight, self.settings["initial_accumulator_value"])}

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        accumulator = slots["accumulator"] + np.square(gradient)
        updated = weight - (cast(weight, step.learning_rate) * gradient) / np.sqrt(accumulator + self.settings["epsilon"])
        return updated, {"accumulator": accumulator}
