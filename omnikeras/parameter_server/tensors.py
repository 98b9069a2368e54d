"""Tensors on the wire: raw little-endian bytes, cut into chunks with a name, dtype, shape.

`encode` turns named arrays into `TensorChunk` messages; `TensorAssembler` rebuilds them on
the other side, checking every chunk against the expected specs before a byte is kept.
"""

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from omnikeras.parameter_server.errors import InvalidArgument, NotFound
from omnikeras.v1 import parameter_server_pb2 as pb

CHUNK_BYTES = 1 << 20
SUPPORTED_DTYPES = frozenset({"float16", "float32", "float64"})


@dataclass(frozen=True)
class VariableSpec:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @classmethod
    def of(cls, name: str, array: np.ndarray) -> "VariableSpec":
        return cls(name, array.dtype, tuple(array.shape))

    @classmethod
    def from_proto(cls, spec: pb.VariableSpec) -> "VariableSpec":
        if spec.dtype not in SUPPORTED_DTYPES:
            raise InvalidArgument(
                f"variable {spec.name!r}: dtype {spec.dtype!r} is not one of "
                f"{sorted(SUPPORTED_DTYPES)}"
            )
        if any(d < 0 for d in spec.shape):
            raise InvalidArgument(f"variable {spec.name!r}: negative dimension {list(spec.shape)}")
        return cls(spec.name, np.dtype(spec.dtype).newbyteorder("<"), tuple(spec.shape))

    def to_proto(self) -> pb.VariableSpec:
        return pb.VariableSpec(name=self.name, dtype=self.dtype.name, shape=self.shape)


def little_endian(array: np.ndarray) -> np.ndarray:
    """Returns `array` as a C-contiguous little-endian array, copying only if needed."""
    dtype = array.dtype.newbyteorder("<")
    return np.ascontiguousarray(array, dtype=dtype)


def encode(
    arrays: Mapping[str, np.ndarray], chunk_bytes: int = CHUNK_BYTES
) -> Iterator[pb.TensorChunk]:
    """Yields the chunks of every array, in the mapping's order."""
    for name, array in arrays.items():
        array = little_endian(array)
        if array.dtype.name not in SUPPORTED_DTYPES:
            raise ValueError(f"{name!r}: dtype {array.dtype} is not one of {sorted(SUPPORTED_DTYPES)}")
        spec = VariableSpec.of(name, array).to_proto()
        raw = memoryview(array.reshape(-1)).cast("B")
        yield pb.TensorChunk(spec=spec, offset=0, data=raw[:chunk_bytes].tobytes())
        for offset in range(chunk_bytes, len(raw), chunk_bytes):
            yield pb.TensorChunk(offset=offset, data=raw[offset : offset + chunk_bytes].tobytes())


class TensorAssembler:
    """Rebuilds arrays from a chunk stream.

    With `expected` specs, a chunk of an unknown variable is NOT_FOUND, and a wrong dtype or
    shape, a byte out of place, a tensor cut short or overrunning, or a variable missing at
    the end is INVALID_ARGUMENT. Without them (the model's first upload) any supported spec
    is taken.
    """

    def __init__(self, expected: Mapping[str, VariableSpec] | None = None) -> None:
        self._expected = expected
        self.arrays: dict[str, np.ndarray] = {}
        self._current: tuple[VariableSpec, np.ndarray] | None = None
        self._filled = 0

    def add(self, chunk: pb.TensorChunk) -> None:
        if chunk.HasField("spec"):
            self._finish_current()
            self._start(VariableSpec.from_proto(chunk.spec))
        if self._current is None:
            raise InvalidArgument("a tensor chunk arrived before any variable spec")
        spec, raw = self._current
        if chunk.offset != self._filled:
            raise InvalidArgument(
                f"variable {spec.name!r}: chunk at byte {chunk.offset}, expected {self._filled}"
            )
        end = self._filled + len(chunk.data)
        if end > len(raw):
            raise InvalidArgument(
                f"variable {spec.name!r}: {end} bytes sent, its shape holds {len(raw)}"
            )
        raw[self._filled : end] = np.frombuffer(chunk.data, dtype=np.uint8)
        self._filled = end

    def finish(self) -> dict[str, np.ndarray]:
        """Returns the arrays, after checking that every expected variable came whole."""
        self._finish_current()
        if self._expected is not None:
            missing = self._expected.keys() - self.arrays.keys()
            if missing:
                raise InvalidArgument(f"stream ended without variables {sorted(missing)}")
        return self.arrays

    def _start(self, spec: VariableSpec) -> None:
        if spec.name in self.arrays:
            raise InvalidArgument(f"variable {spec.name!r} sent twice")
        if self._expected is not None:
            expected = self._expected.get(spec.name)
            if expected is None:
                raise NotFound(f"unknown variable {spec.name!r}")
            if spec.dtype != expected.dtype or spec.shape != expected.shape:
                raise InvalidArgument(
                    f"variable {spec.name!r}: got {spec.dtype.name}{list(spec.shape)}, "
                    f"expected {expected.dtype.name}{list(expected.shape)}"
                )
        array = np.empty(spec.shape, dtype=spec.dtype)
        self._current = (spec, array.reshape(-1).view(np.uint8))
        self.arrays[spec.name] = array

    def _finish_current(self) -> None:
        if self._current is None:
            return
        spec, raw = self._current
        if self._filled != len(raw):
            raise InvalidArgument(
                f"variable {spec.name!r}: stream cut short at byte {self._filled} of {len(raw)}"
            )
        self._current = None
        self._filled = 0


def assemble(
    chunks: Iterable[pb.TensorChunk], expected: Mapping[str, VariableSpec] | None = None
) -> dict[str, np.ndarray]:
    assembler = TensorAssembler(expected)
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.finish()
