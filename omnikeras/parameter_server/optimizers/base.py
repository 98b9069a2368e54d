"""The base of the server's optimizers: one of Keras' optimizers, applied to NumPy arrays
as Keras applies it to its variables, so that a model trained through the server follows
the trajectory Keras' own optimizer would give it.

An optimizer is its settings (`beta_2`, `epsilon`, ...), stored at construction; the
learning rate, the momentum-like setting and the iteration count come with each update,
because the server's schedule and compensated asynchrony change them from update to
update. Arithmetic stays in the variable's dtype, scalars cast as Keras casts them.
"""

import abc
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import scipy.linalg.blas

from omnikeras.parameter_server import tensors
from omnikeras.parameter_server.errors import InvalidArgument

# How an optimizer's momentum-like setting enters its update, which says what asynchrony's
# implicit momentum does to it (see `compensation`):
# - "heavy ball": the step accumulates, `v = momentum * v - lr * g` (SGD, RMSprop): the
#   effective step is `learning_rate / (1 - momentum)`.
# - "average": a moving average of the gradients, `m += (g - m) * (1 - beta_1)` (Adam's
#   family, Lion): the effective step is the learning rate itself.
# - "none": no momentum-like setting (Adagrad, Adadelta, Adafactor, Ftrl), or one that
#   stays as compiled (ScheduleFreeAdamW's `beta_1`, which interpolates iterates).
MomentumForm = Literal["heavy ball", "average", "none"]
# One variable's state, by Keras' names ("momentum", "velocity", ...).
Slots = dict[str, np.ndarray]


@dataclass(frozen=True)
class Step:
    """What changes from one update to the next.

    Attributes:
        learning_rate: The rate in force (the schedule's, compensated where it applies).
        momentum: The momentum-like setting in force (SGD's `momentum`, Adam's `beta_1`).
        iteration: Updates applied before this one: Keras' `optimizer.iterations`.
    """

    learning_rate: float
    momentum: float
    iteration: int


class Optimizer(abc.ABC):
    """One of `keras.optimizers`, on the server.

    A subclass names its Keras class, lists its settings with Keras' defaults and the
    state it keeps for each variable (`slot_names`, Keras' names), and applies one update.

    Args:
        settings: The optimizer's settings besides the learning rate, weight decay and the
            momentum-like setting; booleans as 0 or 1. Unset ones take Keras' defaults.
    """

    name: ClassVar[str]
    defaults: ClassVar[Mapping[str, float]] = {}
    flags: ClassVar[frozenset[str]] = frozenset()
    momentum_setting: ClassVar[str | None] = None
    momentum_form: ClassVar[MomentumForm] = "none"
    slot_names: ClassVar[tuple[str, ...]] = ()
    # Whether the optimizer carries bounds on its magnitudes (`bounds_after`) and updates
    # in place where they allow; the others compute new arrays, checked before use.
    carries_bounds: ClassVar[bool] = False

    def __init__(self, settings: Mapping[str, float] | None = None) -> None:
        settings = dict(settings or {})
        unknown = sorted(set(settings) - set(self.defaults))
        if unknown:
            known = ", ".join(sorted(self.defaults)) or "none"
            raise InvalidArgument(f"{self.name} has no setting {', '.join(unknown)} (its settings: {known})")
        for key, value in settings.items():
            if not math.isfinite(value):
                raise InvalidArgument(f"{self.name}'s {key} must be finite, got {value}")
            if key in self.flags and value not in (0.0, 1.0):
                raise InvalidArgument(f"{self.name}'s {key} is a flag: 0 or 1, got {value}")
        self.settings: dict[str, float] = {**self.defaults, **settings}

    def slots(self, weight: np.ndarray, step: Step) -> Slots:
        """The state of a variable before its first update, as Keras builds it."""
        return {name: np.zeros_like(weight) for name in self.slot_names}

    @abc.abstractmethod
    def update(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> tuple[np.ndarray, Slots]:
        """The weight and its state after one update, as new arrays.

        `weight` and `slots` are left as they were: the server checks the result before
        it puts it in place. `gradient` may serve as scratch space.
        """

    def bounds_after(self, before: "Bounds", change: float, step: Step, dtype: np.dtype) -> "Bounds | None":
        """Bounds on the largest magnitudes in the weight and its state after an update
        whose gradient's magnitudes are bounded by `change`, where finite inputs can only
        give NaN or Inf by overflowing; None where the optimizer carries no such bound
        (its updates are then computed into new arrays and checked).

        An optimizer that returns bounds applies its updates with `update_in_place`.
        """
        return None

    def update_in_place(self, weight: np.ndarray, gradient: np.ndarray, slots: Slots, step: Step) -> None:
        """`update` on the arrays themselves (`gradient` is consumed as scratch space),
        for optimizers whose `bounds_after` says when that is safe."""
        raise NotImplementedError(f"{self.name} computes its updates into new arrays")

    def rate_slots(self) -> tuple[str, ...]:
        """The state `applied_rate` reads: the momentum meter samples these only."""
        return ()

    def applied_rate(self, step: Step, slots: Mapping[str, np.ndarray]) -> float | np.ndarray:
        """The rate each coordinate's update applied: what the momentum meter divides an
        update by to resolve it into the gradients it combined (`momentum_meter`).

        `slots` holds the `rate_slots` of the state after the update, on the meter's
        sampled coordinates only; the result is one rate for them all or one for each.
        The learning rate by default: exact for SGD, with or without momentum, whose
        update is the learning rate times a combination of gradients. The optimizers
        that scale or shape the step otherwise and keep the default (RMSprop, Adagrad,
        Nadam, Lion, Muon, ...) leave the meter's reading approximate.
        """
        return step.learning_rate

    def flag(self, key: str) -> bool:
        return self.settings[key] == 1.0


@dataclass(frozen=True)
class Bounds:
    """Upper bounds on the largest magnitude in a weight and in each array of its state."""

    weight: float
    slots: Mapping[str, float]

    @classmethod
    def summed(cls, weight: np.ndarray, slots: Slots) -> "Bounds":
        """Loose bounds (sums of magnitudes), in one pass per array with no temporary."""
        return cls(tensors.abs_sum(weight), {name: tensors.abs_sum(array) for name, array in slots.items()})

    @classmethod
    def exact(cls, weight: np.ndarray, slots: Slots) -> "Bounds":
        return cls(_largest(weight), {name: _largest(array) for name, array in slots.items()})

    def within(self, dtype: np.dtype) -> bool:
        """Whether no sum of a few terms so bounded can overflow `dtype`."""
        limit = _LIMITS[dtype]
        return self.weight <= limit and all(bound <= limit for bound in self.slots.values())


# A quarter of each dtype's largest value: sums of a few terms below it stay finite.
_LIMITS = {np.dtype(t): float(np.finfo(t).max) / 4 for t in (np.float16, np.float32, np.float64)}


def blas_for(array: np.ndarray) -> tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]] | None:
    """BLAS' axpy and scal for `array`'s dtype, where it has them. The in-place updates
    use them: one pass over the arrays per call, against two for most NumPy expressions of
    the same step (a temporary, then the operation), and the updates are memory-bound."""
    return _BLAS.get(array.dtype) if array.dtype.isnative else None


_BLAS = {
    np.dtype(np.float32): (scipy.linalg.blas.saxpy, scipy.linalg.blas.sscal),
    np.dtype(np.float64): (scipy.linalg.blas.daxpy, scipy.linalg.blas.dscal),
}


def _largest(array: np.ndarray) -> float:
    return float(np.abs(array).max()) if array.size else 0.0


def rounded(value: float, dtype: np.dtype) -> float:
    """`value` rounded to the nearest of `dtype`'s values (Inf past its range), as a
    Python float: scalar arithmetic in the dtype without NumPy's scalars."""
    packer = _PACKERS.get(dtype)
    if packer is None or not math.isfinite(value):
        return value
    try:
        rounded_value: float = packer.unpack(packer.pack(value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
    return rounded_value


# float64 is Python's own float.
_PACKERS = {np.dtype(np.float16): struct.Struct("e"), np.dtype(np.float32): struct.Struct("f")}


def cast(weight: np.ndarray, value: float | np.floating) -> np.floating:
    """`value` in `weight`'s dtype, as Keras' `ops.cast(value, variable.dtype)`."""
    return weight.dtype.type(value)


def decayed(weight: np.ndarray, factor: float) -> np.ndarray:
    """`weight` scaled by 1 - `factor` (the learning rate times Keras' weight decay), as a
    new array."""
    return np.multiply(weight, weight.dtype.type(1.0 - factor))
