"""Schedule-free AdamW, as `keras.optimizers.ScheduleFreeAdamW` applies it: the weights are
the interpolation y between the averaged iterate x and the base iterate z (the
"momentum" slot, which starts as the weight), t = iteration + 1:

    lr_t = learning_rate * min(t / warmup_steps, 1)                  (with warm-up)
    v += (gradient ** 2 - v) * (1 - beta_2)
    z -= lr_t * gradient / (sqrt(v / (1 - beta_2 ** t)) + epsilon)
    x = (y - (1 - beta_1) * z) / beta_1
    x = (1 - 1/t) * x + (1/t) * z
    weight = y = (1 - beta_1) * z + beta_1 * x

Its `beta_1` interpolates iterates rather than averaging gradients, and dividing by it
bounds it away from 0: it stays as compiled (no compensation, no tuning).

z starts at the weights, as the algorithm has it and as Keras' optimizer does when built
before training. Built by `fit` itself (Keras 3.15), Keras' copy of the weights into z
does not take: z starts at 0, and the first update throws a plain run's weights to near
0. The server does not follow that.
"""

import numpy as np

from omnikeras.parameter_server.optimizers.base import Optimizer, Slots, Step, cast


class ScheduleFreeAdamW(Optimizer):
    name = "ScheduleFreeAdamW"
    defaults = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-8, "warmup_steps": 0.0}

    def slots(self, weight: np.ndarray, step: Step) -> Slots:
        return {"momentum": weight.copy(), "velocity": np.zeros_like(weight)}

    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        settings = self.settings
        lr = cast(weight, step.learning_rate)
        local_step = cast(weight, step.iteration + 1)
        beta_1, beta_2 = cast(weight, settings["beta_1"]), cast(weight, settings["beta_2"])
        if settings["warmup_steps"] > 0:
            lr = lr * np.minimum(local_step / cast(weight, settings["warmup_steps"]), 1.0)
        z, v = slots["momentum"], slots["velocity"]
        bias_correction_2 = 1 - np.power(beta_2, local_step)
        v = v + (np.square(gradient) - v) * (1 - beta_2)
        z = z - (lr * gradient) / (np.sqrt(v / bias_correction_2) + cast(weight, settings["epsilon"]))
        share = 1.0 / local_step
        # Keras reads its "momentum_old" from the variable after the step above has
        # changed it, so the updated z recovers x here too.
        x = (weight - (1 - beta_1) * z) / beta_1
        x = (1 - share) * x + share * z
        return (1 - beta_1) * z + beta_1 * x, {"momentum": z, "velocity": v}
