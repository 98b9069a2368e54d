"""A model's variables laid out in one buffer: sorted by name, each on a 64-byte boundary.

The shared-memory segment's two regions and the server's weights and optimizer state share
this arrangement. Where every variable has one dtype, a buffer so laid out is also one
array: a same-host push's finiteness check, its update and the copy of the weights into
a segment become a few passes over whole buffers instead of a few per variable (see
`flat_state` and `shared_memory_server`), and the train step takes its weights in one
array (`strategy.worker.packed`).
"""

import functools
import hashlib
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from omnikeras.parameter_server.tensors import VariableSpec

_L = TypeVar("_L", bound="BufferLayout")

# Every variable starts on a cache line, and numpy's vector loops see aligned arrays.
ALIGNMENT = 64


@dataclass(frozen=True)
class BufferLayout:
    """Where each variable lies in a buffer, in bytes from its start: sorted by name, each
    rounded up to `ALIGNMENT` bytes. The bytes between two variables are padding.

    Example:

    >>> layout = BufferLayout.of({"w": VariableSpec("w", np.dtype("<f4"), (3,))})
    >>> layout.offsets, layout.region_bytes
    ((0,), 64)
    """

    specs: tuple[VariableSpec, ...]
    offsets: tuple[int, ...]
    region_bytes: int

    @classmethod
    def of(cls: type[_L], specs: Mapping[str, VariableSpec]) -> _L:
        ordered = tuple(specs[name] for name in sorted(specs))
        offsets = []
        position = 0
        for spec in ordered:
            offsets.append(position)
            position += -(-spec.nbytes // ALIGNMENT) * ALIGNMENT
        return cls(ordered, tuple(offsets), max(position, ALIGNMENT))

    @functools.cached_property
    def variables_digest(self) -> bytes:
        """SHA-256 of the names, dtypes, shapes and offsets: equal where two layouts place
        the same variables alike."""
        text = ";".join(f"{s.name}:{s.dtype.str}:{list(s.shape)}@{o}" for s, o in zip(self.specs, self.offsets))
        return hashlib.sha256(text.encode()).digest()

    @functools.cached_property
    def dtype(self) -> np.dtype | None:
        """The variables' one dtype, where they share one that divides the alignment; then
        a buffer of this layout is one array (`region`) of it. None otherwise."""
        dtypes = {spec.dtype for spec in self.specs}
        if len(dtypes) != 1:
            return None
        (dtype,) = dtypes
        return dtype if ALIGNMENT % dtype.itemsize == 0 else None

    @functools.cached_property
    def elements(self) -> int:
        """The elements of a `region`, padding included."""
        assert self.dtype is not None, "only a layout of one dtype has elements"
        return self.region_bytes // self.dtype.itemsize

    def span_of(self, name: str) -> slice:
        """The elements of a `region` that variable `name` covers."""
        return self._span_by_name[name]

    @functools.cached_property
    def _span_by_name(self) -> dict[str, slice]:
        assert self.dtype is not None, "only a layout of one dtype has elements"
        itemsize = self.dtype.itemsize
        return {
            spec.name: slice(offset // itemsize, offset // itemsize + int(np.prod(spec.shape, dtype=np.int64)))
            for spec, offset in zip(self.specs, self.offsets)
        }

    @functools.cached_property
    def padding(self) -> np.ndarray:
        """The elements of a `region` that belong to no variable."""
        assert self.dtype is not None, "only a layout of one dtype has elements"
        used = np.zeros(self.region_bytes // self.dtype.itemsize, bool)
        # By variable: `spans` joins neighbours over the padding between them.
        for span in self._span_by_name.values():
            used[span] = True
        return np.flatnonzero(~used)

    def spans(self, names: Iterable[str]) -> list[slice]:
        """The elements of a `region` that `names` cover, in as few slices as there are
        runs of them next to each other in the layout (padding between two included)."""
        wanted = set(names)
        spans: list[slice] = []
        joins = False
        for spec in self.specs:
            if spec.name not in wanted:
                joins = False
                continue
            span = self.span_of(spec.name)
            spans.append(slice(spans.pop().start, span.stop) if joins else span)
            joins = True
        return spans

    def region(self, buffer: object, start: int = 0) -> np.ndarray | None:
        """The layout's bytes of `buffer` from `start` as one array of its dtype; None for a
        layout of several dtypes."""
        if self.dtype is None:
            return None
        return np.frombuffer(buffer, self.dtype, self.region_bytes // self.dtype.itemsize, start)  # type: ignore[call-overload]

    def arrays(self, buffer: object, start: int = 0) -> "FlatArrays":
        """Each variable as a view of `buffer`'s bytes from `start`."""
        arrays = {
            spec.name: np.frombuffer(  # type: ignore[call-overload]
                buffer, spec.dtype, int(np.prod(spec.shape, dtype=np.int64)), start + offset
            ).reshape(spec.shape)
            for spec, offset in zip(self.specs, self.offsets)
        }
        return FlatArrays(arrays, self, self.region(buffer, start))


class FlatArrays(dict[str, np.ndarray]):
    """Arrays by name that are views of one buffer laid out by `layout`; `region` is the
    whole buffer as one array where the layout has one dtype.

    It stays a plain mapping to every reader; `intact` tells whether each name still
    holds the view it was made with, so that a pass over `region` covers them.
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], layout: BufferLayout, region: np.ndarray | None) -> None:
        super().__init__(arrays)
        self.layout = layout
        self.region = region
        self._views = tuple(arrays.values())

    def copy(self) -> "FlatArrays":  # type: ignore[override]
        """A new mapping of the same arrays, intact where this one is."""
        copied = FlatArrays(self, self.layout, self.region)
        copied._views = self._views
        return copied

    def intact(self) -> bool:
        return len(self) == len(self._views) and all(map(operator.is_, self.values(), self._views))

    def region_as(self, layout: BufferLayout) -> np.ndarray | None:
        """The buffer these arrays are views of, as one array, where it is laid out as
        `layout` and every name still holds its view; else None."""
        if self.region is None or self.layout.variables_digest != layout.variables_digest or not self.intact():
            return None
        return self.region
