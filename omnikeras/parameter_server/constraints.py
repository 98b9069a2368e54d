"""Keras' built-in weight constraints (`keras.constraints`), which the server applies to a
variable after each of its updates, as a Keras optimizer applies a variable's constraint
after its step. Each formula is the one of Keras' class of that name, computed in the
weight's dtype:

    NonNeg       weight = max(weight, 0)
    MaxNorm      weight *= clip(norms, 0, max_value) / (epsilon + norms)
    UnitNorm     weight /= epsilon + norms
    MinMaxNorm   weight *= (rate * clip(norms, min_value, max_value) + (1 - rate) * norms)
                           / (epsilon + norms)

where `norms` are the weight's Euclidean norms along `axis` and `epsilon` is
`keras.backend.epsilon()` on the worker that set the rule.

Where a constraint binds, the update it shortens is not the optimizer's alone: the
momentum meter, which reads updates as the optimizer's, reads such a variable's roughly.

A constraint travels as Keras describes it: its class name and `get_config()`, with the
worker's epsilon added for the norm constraints.

    >>> import numpy as np
    >>> weight = np.array([[3.0, 0.0], [4.0, 1.0]], np.float32)
    >>> Constraint("MaxNorm", {"max_value": 1.0, "axis": 0}).apply(weight)
    >>> np.round(weight, 3)
    array([[0.6, 0. ],
           [0.8, 1. ]], dtype=float32)
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnikeras.parameter_server.errors import InvalidArgument
from omnikeras.parameter_server.keras_config import config_from_json, config_json
from omnikeras.v1 import parameter_server_pb2 as pb

# Each constraint's settings besides `epsilon`, as its `get_config()` names them.
SETTINGS: dict[str, frozenset[str]] = {
    "NonNeg": frozenset(),
    "MaxNorm": frozenset({"max_value", "axis"}),
    "UnitNorm": frozenset({"axis"}),
    "MinMaxNorm": frozenset({"min_value", "max_value", "rate", "axis"}),
}
# `keras.backend.epsilon()`'s default.
DEFAULT_EPSILON = 1e-7


@dataclass(frozen=True)
class Constraint:
    """One of Keras' built-in constraints, by class name and configuration."""

    name: str
    config: Mapping[str, Any] = field(hash=False)

    def __post_init__(self) -> None:
        if self.name not in SETTINGS:
            raise InvalidArgument(f"constraint {self.name!r} is not one of Keras' built-in constraints ({', '.join(SETTINGS)})")
        expected = SETTINGS[self.name] | ({"epsilon"} if self.uses_norms else set())
        missing, unknown = SETTINGS[self.name] - set(self.config), set(self.config) - expected
        if missing or unknown:
            raise InvalidArgument(
                f"{self.name} takes the settings {', '.join(sorted(expected)) or 'none'}; "
                f"missing: {sorted(missing)}, unknown: {sorted(unknown)}"
            )
        for key in ("max_value", "min_value", "rate", "epsilon"):
            value = self.config.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"{self.name}'s {key} must be a finite number, 0 or more, got {value!r}")
        if self.name == "MinMaxNorm":
            if self.config["min_value"] > self.config["max_value"]:
                raise InvalidArgument(f"MinMaxNorm's min_value {self.config['min_value']} exceeds its max_value")
            # Beyond 1 the constraint would push norms past its bounds, which the server's
            # guard against overflow does not follow.
            if self.config["rate"] > 1:
                raise InvalidArgument(f"MinMaxNorm's rate must lie in [0, 1], got {self.config['rate']}")
        if not all(isinstance(a, int) and not isinstance(a, bool) for a in self.axes or ()):
            raise InvalidArgument(
                f"{self.name}'s axis must be an integer, a list of integers or None, got {self.config['axis']!r}"
            )

    @property
    def uses_norms(self) -> bool:
        return self.name != "NonNeg"

    @property
    def epsilon(self) -> float:
        return float(self.config.get("epsilon", DEFAULT_EPSILON))

    @property
    def axes(self) -> tuple[int, ...] | None:
        """The axes the norms run along; None for all of them (Keras' `axis=None`)."""
        axis = self.config.get("axis")
        return None if axis is None else tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)

    def check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Raises `InvalidArgument` where the norms' axes do not exist in `shape`."""
        outside = [a for a in self.axes or () if not -len(shape) <= a < len(shape)]
        if outside:
            raise InvalidArgument(f"{self.name} on {name} (shape {shape}) takes norms along axis {outside}, which it lacks")

    def apply(self, weight: np.ndarray) -> None:
        """Constrains `weight` in place."""
        if not self.uses_norms:
            np.maximum(weight, weight.dtype.type(0), out=weight)
            return
        dtype = weight.dtype.type
        norms = np.sqrt(np.sum(np.square(weight), axis=self.axes, keepdims=True))
        if self.name == "UnitNorm":
            weight /= dtype(self.epsilon) + norms
            return
        if self.name == "MaxNorm":
            desired = np.clip(norms, dtype(0), dtype(self.config["max_value"]))
        else:
            rate = self.config["rate"]
            clipped = np.clip(norms, dtype(self.config["min_value"]), dtype(self.config["max_value"]))
            desired = dtype(rate) * clipped + dtype(1 - rate) * norms
        weight *= desired / (dtype(self.epsilon) + norms)

    def bound_after(self, bound: float) -> float:
        """A bound on the largest magnitude of a weight bounded by `bound` once
        constrained: MaxNorm and NonNeg only shrink magnitudes, UnitNorm leaves them under
        1, and MinMaxNorm (rate in [0, 1]) under the larger of `bound` and `max_value`."""
        if self.name == "UnitNorm":
            return 1.0
        if self.name == "MinMaxNorm":
            return max(bound, float(self.config["max_value"]))
        return bound

    def norms_stay_finite(self, bound: float, size: int, dtype: np.dtype) -> bool:
        """Whether the norms of a weight of `size` elements bounded by `bound` are finite
        in `dtype`: a norm that overflows makes MinMaxNorm's weight NaN."""
        return not self.uses_norms or bound * bound * size <= float(np.finfo(dtype).max) / 4

    @classmethod
    def from_proto(cls, message: pb.Constraint) -> "Constraint":
        return cls(message.name, config_from_json(message.config_json, "constraint"))

    def to_proto(self) -> pb.Constraint:
        return pb.Constraint(name=self.name, config_json=config_json(self.config))
