"""The server's update rule: which of Keras' optimizers it applies (see `optimizers`),
with which settings, learning rate or schedule, and weight decay, so that a model trained
through the server follows the trajectory of one trained by that Keras optimizer:

    gradient = clip(gradient)                     (where the workers leave it to the server)
    weight *= 1 - learning_rate * weight_decay    (Keras' decoupled weight decay)
    the optimizer's update                        (SGD's, Adam's, ...)
    average = ema_momentum * average + (1 - ema_momentum) * weight     (Keras' `use_ema`)
    weight = constraint(weight)                   (the variable's, where it has one)

(under gradient accumulation, the gradient is the mean of those accumulated since the last
update; see `ModelState`)

with the learning rate of the schedule at the server's iteration count when one is set,
or the rate the workers push with their gradients where only they can evaluate it.
A statistic (a variable the model trains itself) takes the change a worker pushed:

    weight += change

Muon updates the variables Keras' Muon leaves to AdamW by AdamW's update, with a weight
decay of their own (see `optimizers.muon`).
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from omnikeras.parameter_server.clipping import Clipping
from omnikeras.parameter_server.constraints import Constraint
from omnikeras.parameter_server.errors import InvalidArgument
from omnikeras.parameter_server.optimizers import Optimizer, optimizer_named
from omnikeras.parameter_server.optimizers.muon import Muon
from omnikeras.parameter_server.schedules import LearningRateSchedule
from omnikeras.v1 import parameter_server_pb2 as pb


@dataclass(frozen=True)
class Hyperparameters:
    """The server's update rule: a Keras optimizer and its settings.

    Args:
        learning_rate: The rate while no schedule is set.
        momentum: The optimizer's momentum-like setting (`Optimizer.momentum_setting`:
            SGD's, RMSprop's and Muon's `momentum`, the `beta_1` of Adam's family and
            Lion's; 0 for optimizers without one); asynchrony adds its own.
        learning_rate_schedule: A Keras built-in schedule, evaluated at the server's
            iteration count (the updates it has applied); replaces `learning_rate`.
        weight_decay: Keras' decoupled weight decay, scaled by the learning rate.
        no_weight_decay: Names of the variables weight decay leaves alone.
        statistics: Names of the variables the model trains itself (batch-normalization
            statistics): their pushes are changes, added as they come, averaged over the
            group's members.
        compensate_asynchrony: With more than one group, the momentum and learning rate
            in force are steered so that the updates' total momentum and effective step
            are these (see `compensation`). Defaults to True; False applies them as
            they are.
        optimizer: The Keras class name of the optimizer (see `optimizers.OPTIMIZERS`).
        settings: Its other settings (`beta_2`, `epsilon`, `amsgrad`, SGD's `nesterov`,
            ...), booleans as 0 or 1; unset ones take Keras' defaults.
        adamw_variables: Under Muon, the names of the variables that take its AdamW update
            rather than its orthogonalized one, as Keras' Muon chooses them by path and
            shape (see `optimizers.muon`).
        learning_rate_from_workers: The workers evaluate the learning rate (a schedule of
            the user's own, or a rate given as a function) and push it with each
            gradient; `learning_rate` is the rate until the first push.
        constraints: The constrained variables' constraints, by variable name (Keras'
            built-in ones: see `constraints`), applied after each update.
        ema_momentum: Keras' `ema_momentum` where the optimizer keeps a moving average of
            each weight (`use_ema`); None where it keeps none.
        ema_overwrite_frequency: Keras' `ema_overwrite_frequency`: every so many updates
            each weight takes its average (0: only when a training ends).
        gradient_accumulation_steps: Keras' `gradient_accumulation_steps`: the weights
            are updated every so many group steps, with the mean of their gradients;
            the steps between only accumulate them (0: every group step updates).
        clipping: Keras' gradient clipping of each update's gradients, where the workers
            leave it to the server (under gradient accumulation: see `clipping`).
    """

    learning_rate: float = 0.01
    momentum: float = 0.0
    learning_rate_schedule: LearningRateSchedule | None = None
    weight_decay: float = 0.0
    no_weight_decay: frozenset[str] = frozenset()
    statistics: frozenset[str] = frozenset()
    compensate_asynchrony: bool = True
    optimizer: str = "SGD"
    settings: Mapping[str, float] = field(default_factory=dict)
    adamw_variables: frozenset[str] = frozenset()
    learning_rate_from_workers: bool = False
    constraints: Mapping[str, Constraint] = field(default_factory=dict)
    ema_momentum: float | None = None
    ema_overwrite_frequency: int = 0
    gradient_accumulation_steps: int = 0
    clipping: Clipping = field(default_factory=Clipping)
    # The optimizer itself, built once per rule: Nadam keeps a running product.
    rule: Optimizer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from_workers = self.learning_rate_from_workers
        if from_workers and self.learning_rate_schedule is not None:
            raise InvalidArgument("the server evaluates a learning-rate schedule: it cannot come from the workers too")
        # Under a schedule, the server's or the workers', the rate only reports the
        # schedule's (a warm-up starts at 0).
        if from_workers and not (math.isfinite(self.learning_rate) and self.learning_rate >= 0):
            raise InvalidArgument(f"learning_rate must be finite and 0 or more, got {self.learning_rate}")
        if self.learning_rate_schedule is None and not from_workers and not _positive_in_float32(self.learning_rate):
            raise InvalidArgument(f"learning_rate must be a positive number within float32's range, got {self.learning_rate}")
        # Asynchrony adds implicit momentum, so the explicit one may need to go below 0.
        if not (math.isfinite(self.momentum) and -1 < self.momentum < 1):
            raise InvalidArgument(f"momentum must lie in (-1, 1), got {self.momentum}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise InvalidArgument(f"weight_decay must be 0 or positive, got {self.weight_decay}")
        if self.ema_momentum is not None and not (math.isfinite(self.ema_momentum) and 0 <= self.ema_momentum <= 1):
            raise InvalidArgument(f"ema_momentum must lie in [0, 1], got {self.ema_momentum}")
        if self.ema_overwrite_frequency < 0 or (self.ema_overwrite_frequency and self.ema_momentum is None):
            raise InvalidArgument(
                f"ema_overwrite_frequency must be 0, or positive with an ema_momentum, got {self.ema_overwrite_frequency}"
            )
        if self.gradient_accumulation_steps < 0 or self.gradient_accumulation_steps == 1:
            raise InvalidArgument(f"gradient_accumulation_steps must be 0 or 2 or more, got {self.gradient_accumulation_steps}")
        rule = optimizer_named(self.optimizer, self.settings)
        if rule.momentum_setting is None and self.momentum != 0:
            raise InvalidArgument(f"{self.optimizer} has no momentum-like setting: momentum must be 0, got {self.momentum}")
        if self.adamw_variables and not isinstance(rule, Muon):
            raise InvalidArgument(f"adamw_variables are Muon's choice; {self.optimizer} updates every variable alike")
        object.__setattr__(self, "rule", rule)

    def learning_rate_at(self, iteration: int) -> float:
        if self.learning_rate_schedule is None:
            return self.learning_rate
        return self.learning_rate_schedule(iteration)

    def overwrites_with_average(self, iteration: int) -> bool:
        """Whether the update after `iteration` updates puts each weight's average in its
        place, as Keras' `ema_overwrite_frequency` does."""
        frequency = self.ema_overwrite_frequency
        return bool(frequency) and (iteration + 1) % frequency == 0

    def optimizer_of(self, name: str) -> Optimizer:
        """The optimizer that updates variable `name`: the rule's, or Muon's AdamW."""
        if name in self.adamw_variables and isinstance(self.rule, Muon):
            return self.rule.adamw
        return self.rule

    def check_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Raises `InvalidArgument` where the rule cannot update variables of these shapes:
        a constraint takes norms along an axis its variable lacks; Muon orthogonalizes
        matrices only, and Keras' Muon leaves every other variable to AdamW (a rule a
        worker built names them all)."""
        for name, constraint in self.constraints.items():
            if name in shapes:
                constraint.check_shape(name, shapes[name])
        if not isinstance(self.rule, Muon):
            return
        apart = self.adamw_variables | self.statistics
        others = sorted(name for name, shape in shapes.items() if len(shape) != 2 and name not in apart)
        if others:
            raise InvalidArgument(
                f"Muon orthogonalizes matrices only: {', '.join(others)} must be among its adamw_variables"
            )

    def weight_decay_of(self, name: str) -> float:
        """The weight decay of variable `name` (0 for none): Muon's AdamW variables take
        its `adam_weight_decay`, as Keras' Muon decays them."""
        if name in self.no_weight_decay or name in self.statistics:
            return 0.0
        if name in self.adamw_variables:
            return self.rule.settings["adam_weight_decay"]
        return self.weight_decay

    @classmethod
    def from_proto(cls, message: pb.Hyperparameters) -> "Hyperparameters":
        schedule = None
        if message.HasField("learning_rate_schedule"):
            schedule = LearningRateSchedule.from_proto(message.learning_rate_schedule)
        settings = dict(message.settings)
        if message.nesterov:
            settings["nesterov"] = 1.0
        return cls(
            message.learning_rate,
            message.momentum,
            schedule,
            message.weight_decay,
            frozenset(message.no_weight_decay),
            frozenset(message.statistics),
            message.compensate_asynchrony,
            message.optimizer or "SGD",
            settings,
            frozenset(message.adamw_variables),
            message.learning_rate_from_workers,
            {name: Constraint.from_proto(constraint) for name, constraint in message.constraints.items()},
            message.ema_momentum if message.use_ema else None,
            message.ema_overwrite_frequency,
            message.gradient_accumulation_steps,
            Clipping(message.clipnorm, message.global_clipnorm, message.clipvalue),
        )

    def to_proto(self) -> pb.Hyperparameters:
        return pb.Hyperparameters(
            learning_rate=self.learning_rate,
            momentum=self.momentum,
            learning_rate_schedule=self.learning_rate_schedule.to_proto() if self.learning_rate_schedule else None,
            weight_decay=self.weight_decay,
            no_weight_decay=sorted(self.no_weight_decay),
            statistics=sorted(self.statistics),
            compensate_asynchrony=self.compensate_asynchrony,
            optimizer=self.optimizer,
            settings=dict(self.settings),
            adamw_variables=sorted(self.adamw_variables),
            learning_rate_from_workers=self.learning_rate_from_workers,
            constraints={name: constraint.to_proto() for name, constraint in self.constraints.items()},
            use_ema=self.ema_momentum is not None,
            ema_momentum=self.ema_momentum or 0.0,
            ema_overwrite_frequency=self.ema_overwrite_frequency,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            clipnorm=self.clipping.clipnorm,
            global_clipnorm=self.clipping.global_clipnorm,
            clipvalue=self.clipping.clipvalue,
        )


def _positive_in_float32(value: float) -> bool:
    """Positive and finite also as a float32: a rate that overflows a float32 model's
    update poisons its weights."""
    with np.errstate(over="ignore"):
        narrowed = np.float32(value)
    return math.isfinite(value) and bool(np.isfinite(narrowed) and narrowed > 0)
