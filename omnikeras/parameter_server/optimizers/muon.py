"""Muon, as `keras.optimizers.Muon` applies it: each matrix's momentum, orthogonalized by
Newton-Schulz iterations, for the variables Keras gives Muon's update, and AdamW's update
(`MuonAdamW`) for the others:

    m = momentum * m + gradient
    g = gradient + momentum * m                (nesterov; else g = m)
    x = g / (|g| + 1e-7)                       (Frobenius norm; transposed while taller than wide)
    x = a * x + (b * x x^T + c * (x x^T)^2) x  (ns_steps times; a, b, c: muon_a, muon_b, muon_c)
    weight -= learning_rate * x * sqrt(max(rows, columns)) * rms_rate

Which variables take AdamW's update Keras decides by shape and path (`_should_use_adamw`:
those not of two dimensions, embeddings, the `exclude_layers` patterns): the worker
decides, where the paths and patterns are, and `Hyperparameters.adamw_variables` carries
the choice. Their weight decay is `adam_weight_decay`, the others' `weight_decay`, both
scaled by the learning rate itself (`Hyperparameters.weight_decay_of`).

`rms_rate` 0 stands for Keras' None: the update is not rescaled (Keras' own 0 would leave
the matrices unmoved, and the worker refuses it).

Muon's `momentum` is its momentum-like setting, of the "average" form: the orthogonalized
update's size is the learning rate's whatever the momentum. The AdamW variables'
`adam_beta_1` stays as compiled.
"""

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from omnikeras.parameter_server.errors import InvalidArgument
from omnikeras.parameter_server.optimizers.adam import Adam
from omnikeras.parameter_server.optimizers.base import MomentumForm, Optimizer, Slots, Step, cast


class Muon(Optimizer):
    name = "Muon"
    defaults = {
        "adam_beta_1": 0.9,
        "adam_beta_2": 0.999,
        "epsilon": 1e-7,
        "adam_weight_decay": 0.004,
        "adam_lr_ratio": 1.0,
        "muon_a": 3.4445,
        "muon_b": -4.7750,
        "muon_c": 2.0315,
        "ns_steps": 5.0,
        "nesterov": 1.0,
        "rms_rate": 0.2,
    }
    flags = frozenset({"nesterov"})
    momentum_setting = "momentum"
    momentum_form: ClassVar[MomentumForm] = "average"
    slot_names = ("momentum",)

    def __init__(self, settings: Mapping[str, float] | None = None) -> None:
        super().__init__(settings)
        steps = self.settings["ns_steps"]
        if steps < 0 or steps != int(steps):
            raise InvalidArgument(f"Muon's ns_steps counts iterations: a whole number, 0 or more, got {steps}")
        # Hyperparameters' own weight decay is checked alike.
        adam_weight_decay = self.settings["adam_weight_decay"]
        if adam_weight_decay < 0:
            raise InvalidArgument(f"Muon's adam_weight_decay must be 0 or positive, got {adam_weight_decay}")
        self.adamw = MuonAdamW(self.settings)

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        momentum = step.momentum
        m = slots["momentum"]
        m = m + (gradient + m * (momentum - 1))
        g = gradient + momentum * m if self.flag("nesterov") else m
        update = cast(weight, step.learning_rate) * self._orthogonalized(g)
        rms_rate = self.settings["rms_rate"]
        if rms_rate:
            update = update * np.sqrt(cast(weight, max(weight.shape[0], weight.shape[1]))) * rms_rate
        return weight - update, {"momentum": m}

    def _orthogonalized(self, g: np.ndarray) -> np.ndarray:
        """Keras' `zeropower_via_newtonschulz5`: about U V^T of g's singular value
        decomposition, in the same operations."""
        a, b, c = self.settings["muon_a"], self.settings["muon_b"], self.settings["muon_c"]
        tall = g.shape[-2] > g.shape[-1]
        x = np.swapaxes(g, -2, -1) if tall else g
        x = x / (np.sqrt(np.sum(x * x, axis=(-2, -1), keepdims=True)) + 1e-7)
        for _ in range(int(self.settings["ns_steps"])):
            gram = x @ np.swapaxes(x, -2, -1)
            x = a * x + (b * gram + c * gram @ gram) @ x
        return np.swapaxes(x, -2, -1) if tall else x


class MuonAdamW(Optimizer):
    """Muon's update of the variables Keras' Muon leaves to AdamW: Adam's, at Muon's
    `adam_beta_1`, `adam_beta_2` and `epsilon`, and `adam_lr_ratio` times the learning
    rate (Keras' `_adamw_update_step`). Its slots are Keras': "momentum" and "velocity".

    Args:
        settings: Muon's settings, checked by `Muon`.
    """

    name = Muon.name
    defaults = Muon.defaults
    flags = Muon.flags
    slot_names = ("momentum", "velocity")

    def __init__(self, settings: Mapping[str, float]) -> None:
        super().__init__(settings)
        self._adam = Adam({"beta_2": self.settings["adam_beta_2"], "epsilon": self.settings["epsilon"]})

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        settings = self.settings
        adam_step = Step(step.learning_rate * settings["adam_lr_ratio"], settings["adam_beta_1"], step.iteration)
        return self._adam.update(weight, gradient, slots, adam_step)
