"""Passes over large arrays, split between the calling thread and one helper thread.

NumPy releases the GIL inside its loops, so two threads stream the two halves of an array
at once, about twice as fast on this kind of memory-bound work. Below `SPLIT_ELEMENTS`
the hand-over costs more than it saves, and the work stays on the calling thread (where
BLAS, which keeps the GIL, is the faster choice).
"""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

_T = TypeVar("_T")

SPLIT_ELEMENTS = 1 << 22

_helper = ThreadPoolExecutor(1, thread_name_prefix="omnikeras-split")


def worth_splitting(*arrays: np.ndarray) -> bool:
    """Whether `split_pass` would split these arrays: large, and all C-contiguous."""
    return arrays[0].size >= SPLIT_ELEMENTS and all(a.flags.c_contiguous for a in arrays)


def split_pass(operation: Callable[..., _T], *arrays: np.ndarray) -> list[_T]:
    """Runs `operation` on the first halves of the flattened `arrays` here and on the
    second halves in the helper thread, at once; returns both results. The arrays must
    have the same size and pass `worth_splitting`."""
    flat = [a.reshape(-1) for a in arrays]
    middle = flat[0].size // 2
    second = _helper.submit(operation, *(f[middle:] for f in flat))
    return [operation(*(f[:middle] for f in flat)), second.result()]


def copy(destination: np.ndarray, source: np.ndarray) -> None:
    """`np.copyto(destination, source)` for arrays of one shape and dtype, split when
    worth it."""
    if worth_splitting(destination, source):
        split_pass(np.copyto, destination, source)
    else:
        np.copyto(destination, source)
