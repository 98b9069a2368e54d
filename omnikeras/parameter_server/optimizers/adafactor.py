"""Adafactor, as `keras.optimizers.Adafactor` applies it, its second moments factored
into row and column means for variables of two dimensions or more (t = iteration + 1):

    rho = min(learning_rate, 1 / sqrt(t));  alpha = max(epsilon_2, rms(weight)) * rho
    g2 = gradient ** 2 + epsilon_1;  beta_2 = 1 - t ** beta_2_decay
    r = beta_2 * r + (1 - beta_2) * mean(g2, last axis)          (two dimensions or more)
    c = beta_2 * c + (1 - beta_2) * mean(g2, second-last axis)
    v = (r / mean(r)) x c                                          (else v = beta_2 * v + (1 - beta_2) * g2)
    u = gradient / sqrt(v);  weight -= alpha * u / max(1, rms(u) / clip_threshold)
"""

import numpy as np

from omnikeras.parameter_server.optimizers.base import Optimizer, Slots, Step, cast


class Adafactor(Optimizer):
    name = "Adafactor"
    defaults = {"beta_2_decay": -0.8, "epsilon_1": 1e-30, "epsilon_2": 1e-3, "clip_threshold": 1.0}

    def slots(self, weight: np.ndarray, step: Step) -> Slots:
        slots = {"velocity": np.zeros_like(weight)}
        if weight.ndim >= 2:
            slots["r"] = np.zeros(weight.shape[:-1], weight.dtype)
            slots["c"] = np.zeros(weight.shape[:-2] + weight.shape[-1:], weight.dtype)
        return slots

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        settings = self.settings
        one = cast(weight, 1.0)
        local_step = cast(weight, step.iteration + 1)
        rho = np.minimum(cast(weight, step.learning_rate), 1 / np.sqrt(local_step))
        alpha = np.maximum(cast(weight, settings["epsilon_2"]), _rms(weight)) * rho
        squared = np.square(gradient) + settings["epsilon_1"]
        beta_2 = 1 - np.power(local_step, settings["beta_2_decay"])
        if weight.ndim >= 2:
            r = beta_2 * slots["r"] + (1 - beta_2) * np.mean(squared, axis=-1)
            c = beta_2 * slots["c"] + (1 - beta_2) * np.mean(squared, axis=-2)
            v = np.expand_dims(r / np.mean(r, axis=-1, keepdims=True), -1) * np.expand_dims(c, -2)
            state = {"velocity": v, "r": r, "c": c}
        else:
            v = beta_2 * slots["velocity"] + (1 - beta_2) * squared
            state = {"velocity": v}
        u = gradient / np.sqrt(v)
        return weight - alpha * (u / np.maximum(one, _rms(u) / settings["clip_threshold"])), state


def _rms(x: np.ndarray) -> np.floating:
    return np.sqrt(np.mean(np.square(x)))
