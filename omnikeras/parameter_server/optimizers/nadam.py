"""Nadam, as `keras.optimizers.Nadam` applies it, with Keras' momentum schedule
`u_t = beta_1 * (1 - 0.5 * 0.96 ** t)` and its running product (t = iteration + 1):

    m += (gradient - m) * (1 - beta_1)
    v += (gradient ** 2 - v) * (1 - beta_2)
    m_hat = u_(t+1) * m / (1 - u_1 ... u_(t+1)) + (1 - u_t) * gradient / (1 - u_1 ... u_t)
    weight -= learning_rate * m_hat / (sqrt(v / (1 - beta_2 ** t)) + epsilon)
"""

from typing import ClassVar

import numpy as np

from omnikeras.parameter_server.optimizers.base import MomentumForm, Optimizer, Slots, Step, cast


class Nadam(Optimizer):
    name = "Nadam"
    defaults = {"beta_2": 0.999, "epsilon": 1e-7}
    momentum_setting = "beta_1"
    momentum_form: ClassVar[MomentumForm] = "average"
    slot_names = ("momentum", "velocity")

    def __init__(self, settings: dict[str, float] | None = None) -> None:
        super().__init__(settings)
        # The running product as of an iteration: one value for all the variables of an
        # update, extended by one factor per update (Keras keeps it as a variable).
        self._product: tuple[int, np.float32] = (0, np.float32(1.0))

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        beta_1 = cast(weight, step.momentum)
        beta_2 = cast(weight, self.settings["beta_2"])
        local_step = cast(weight, step.iteration + 1)
        decay = cast(weight, 0.96)
        u_t = beta_1 * (1.0 - 0.5 * np.power(decay, local_step))
        u_t_1 = beta_1 * (1.0 - 0.5 * np.power(decay, cast(weight, step.iteration + 2)))
        u_product_t = cast(weight, self._product_through(step.iteration + 1, step.momentum))
        u_product_t_1 = u_product_t * u_t_1
        beta_2_power = np.power(beta_2, local_step)
        m, v = slots["momentum"], slots["velocity"]
        m = m + (gradient - m) * (1 - beta_1)
        v = v + (np.square(gradient) - v) * (1 - beta_2)
        m_hat = (u_t_1 * m) / (1 - u_product_t_1) + ((1 - u_t) * gradient) / (1 - u_product_t)
        v_hat = v / (1 - beta_2_power)
        updated = weight - (m_hat * cast(weight, step.learning_rate)) / (np.sqrt(v_hat) + self.settings["epsilon"])
        return updated, {"momentum": m, "velocity": v}

    def _product_through(self, t: int, beta_1: float) -> np.float32:
        """`u_1 ... u_t` in float32, as Keras multiplies it up one update at a time (with
        the `beta_1` in force now for factors not seen yet, after a restart)."""
        done, product = self._product
        if done > t:
            done, product = 0, np.float32(1.0)
        while done < t:
            done += 1
            product = product * np.float32(beta_1) * (np.float32(1.0) - np.float32(0.5) * np.power(np.float32(0.96), np.float32(done)))
        self._product = (done, product)
        return product
