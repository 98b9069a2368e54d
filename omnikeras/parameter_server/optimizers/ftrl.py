"""FTRL-Proximal, as `keras.optimizers.Ftrl` applies it (p = `learning_rate_power`):

    l2 = l2_regularization_strength + beta / (2 * learning_rate)
    g = gradient + 2 * l2_shrinkage_regularization_strength * weight
    n' = n + gradient ** 2
    linear += g - (n' ** -p - n ** -p) / learning_rate * weight
    weight = (clip(linear, -l1, l1) - linear) / (n' ** -p / learning_rate + 2 * l2)
    n = n'
"""

import numpy as np

from omnikeras.parameter_server.optimizers.base import Optimizer, Slots, Step, cast


class Ftrl(Optimizer):
    name = "Ftrl"
    defaults = {
        "learning_rate_power": -0.5,
        "initial_accumulator_value": 0.1,
        "l1_regularization_strength": 0.0,
        "l2_regularization_strength": 0.0,
        "l2_shrinkage_regularization_strength": 0.0,
        "beta": 0.0,
    }

    def slots(self, weight: np.ndarray, step: Step) -> Slots:
        return {
            "accumulator": np.full_like(weight, self.settings["initial_accumulator_value"]),
            "linear": np.zeros_like(weight),
        }

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        settings = self.settings
        lr = cast(weight, step.learning_rate)
        power = settings["learning_rate_power"]
        l1 = settings["l1_regularization_strength"]
        l2 = settings["l2_regularization_strength"] + settings["beta"] / (2.0 * lr)
        accumulator, linear = slots["accumulator"], slots["linear"]
        shrunk = gradient + (2 * settings["l2_shrinkage_regularization_strength"]) * weight
        new_accumulator = accumulator + np.square(gradient)
        linear = linear + (shrunk - ((np.power(new_accumulator, -power) - np.power(accumulator, -power)) / lr) * weight)
        quadratic = np.power(new_accumulator, -power) / lr + 2 * l2
        updated = (np.clip(linear, -l1, l1) - linear) / quadratic
        return updated, {"accumulator": new_accumulator, "linear": linear}
