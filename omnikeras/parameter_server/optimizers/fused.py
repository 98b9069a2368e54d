"""Adam's step as one compiled pass over the arrays.

NumPy and BLAS pass over the arrays once per operation, 9 times for Adam's step, where
these loops (compiled by Numba on first use, and cached on disk) read each array once and
write it once. In a launched run of the main job's CNN, the update of its 225K parameters
took 116 µs against 253 µs in BLAS passes, out of a server push of about 0.7 ms. SGD's
3 BLAS passes stay: there, the compiled call cost more than it saved (101 µs against 88).

The loops follow Keras' arithmetic in the arrays' dtype: callers pass the settings as
scalars of that dtype (`base.cast`); Python floats would make them compute in float64.
They release the GIL, so that `parallel.split_pass` can run them on two threads.
"""

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

FUSED_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


def applies(*arrays: np.ndarray) -> bool:
    """Whether the loops take these arrays: one native float32 or float64 dtype, and
    each C-contiguous (so that its flat view is one)."""
    dtype = arrays[0].dtype
    return dtype in FUSED_DTYPES and all(a.dtype == dtype and a.flags.c_contiguous for a in arrays)


def _compiled(function: Callable[..., None]) -> Callable[..., None]:
    # NumPy's error model (a division by zero gives Inf, as in NumPy) lets the loops
    # vectorize: with Python's, which raises, Adam's loop took 404 µs against 170 for
    # BLAS' nine passes.
    compiled: Callable[..., None] = numba.njit(nogil=True, cache=True, error_model="numpy")(function)
    return compiled


@_compiled
def adam(
    weight: np.ndarray,
    gradient: np.ndarray,
    momentum: np.ndarray,
    velocity: np.ndarray,
    rest_1: Any,
    rest_2: Any,
    epsilon: Any,
    alpha: Any,
) -> None:
    """Keras' Adam on flat arrays: `m += (g - m) * (1 - beta_1)`, `v += (g ** 2 - v) * (1 -
    beta_2)`, `weight -= m * alpha / (sqrt(v) + epsilon)`; `rest_1` and `rest_2` are
    `1 - beta_1` and `1 - beta_2`, computed as Keras does (in Python, then cast)."""
    for i in range(weight.size):
        g = gradient[i]
        m = momentum[i] + (g - momentum[i]) * rest_1
        v = velocity[i] + (g * g - velocity[i]) * rest_2
        momentum[i] = m
        velocity[i] = v
        weight[i] -= (m * alpha) / (np.sqrt(v) + epsilon)


@_compiled
def adam_amsgrad(
    weight: np.ndarray,
    gradient: np.ndarray,
    momentum: np.ndarray,
    velocity: np.ndarray,
    velocity_hat: np.ndarray,
    rest_1: Any,
    rest_2: Any,
    epsilon: Any,
    alpha: Any,
) -> None:
    """`adam` with AMSGrad: the root of the largest `v` so far, `velocity_hat`, divides."""
    for i in range(weight.size):
        g = gradient[i]
        m = momentum[i] + (g - momentum[i]) * rest_1
        v = velocity[i] + (g * g - velocity[i]) * rest_2
        v_hat = np.maximum(velocity_hat[i], v)
        momentum[i] = m
        velocity[i] = v
        velocity_hat[i] = v_hat
        weight[i] -= (m * alpha) / (np.sqrt(v_hat) + epsilon)
