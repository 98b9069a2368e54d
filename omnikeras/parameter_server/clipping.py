"""Keras' gradient clipping (`clipnorm`, `global_clipnorm`, `clipvalue`) of an update's
gradients, on the server: under gradient accumulation Keras clips the mean of the
accumulated gradients, which only the server sees (elsewhere each worker clips its own, as
each of Keras' replicas does). The formulas are Keras', in the gradients' dtype; as in
Keras, one of the three at most is set.

    >>> import numpy as np
    >>> gradients = {"w": np.array([3.0, 4.0], np.float32)}
    >>> Clipping(clipnorm=1.0).apply(gradients)
    >>> gradients["w"]
    array([0.6, 0.8], dtype=float32)
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from omnikeras.parameter_server.errors import InvalidArgument


@dataclass(frozen=True)
class Clipping:
    """Keras' clipping settings; 0 for one not set."""

    clipnorm: float = 0.0
    global_clipnorm: float = 0.0
    clipvalue: float = 0.0

    def __post_init__(self) -> None:
        for key in ("clipnorm", "global_clipnorm", "clipvalue"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidArgument(f"{key} must be finite and 0 or more, got {value}")
        if sum(bool(value) for value in (self.clipnorm, self.global_clipnorm, self.clipvalue)) > 1:
            raise InvalidArgument(f"only one of clipnorm, global_clipnorm and clipvalue can be set, as in Keras: {self}")

    def __bool__(self) -> bool:
        return bool(self.clipnorm or self.global_clipnorm or self.clipvalue)

    def apply(self, gradients: Mapping[str, np.ndarray]) -> None:
        """Clips the gradients in place."""
        if self.clipnorm:
            for gradient in gradients.values():
                _clip_by_norm(gradient, self.clipnorm)
        elif self.global_clipnorm:
            _clip_by_global_norm(list(gradients.values()), self.global_clipnorm)
        elif self.clipvalue:
            for gradient in gradients.values():
                np.clip(gradient, -self.clipvalue, self.clipvalue, out=gradient)


def _clip_by_norm(gradient: np.ndarray, clip_norm: float) -> None:
    dtype = gradient.dtype.type
    l2sum = np.sum(np.square(gradient), dtype=gradient.dtype)
    # Keras' two-tap where: a norm of 0 (or NaN) is kept as it is, not rooted.
    l2norm = np.sqrt(l2sum) if l2sum > 0 else l2sum
    gradient *= dtype(clip_norm)
    gradient /= np.maximum(l2norm, dtype(clip_norm))


def _clip_by_global_norm(gradients: list[np.ndarray], clip_norm: float) -> None:
    if not gradients:
        return
    dtype = gradients[0].dtype.type
    norm = np.sqrt(np.sum([np.sum(np.square(g), dtype=g.dtype) for g in gradients], dtype=gradients[0].dtype))
    with np.errstate(divide="ignore", invalid="ignore"):
        # A norm of Inf or NaN makes the scale NaN, as in Keras: the update is refused.
        scale = dtype(clip_norm) * np.minimum(dtype(1) / norm, dtype(1) / dtype(clip_norm)) + (norm - norm)
    for gradient in gradients:
        gradient *= scale
