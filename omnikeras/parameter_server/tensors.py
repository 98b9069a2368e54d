"""Tensors on the wire: raw little-endian bytes, cut into chunks with a name, dtype, shape.

`encode` turns named arrays into `TensorChunk` messages; `TensorAssembler` rebuilds them on
the other side, checking every chunk against the expected specs before a byte is kept.

The streams that carry models (InitModel, Push, Pull, PushPull) bypass protobuf for the
bulk of their bytes: `encode_messages` writes serialized messages directly, copying each
chunk's bytes once, and `decoder` parses them leaving each chunk's bytes in the buffer gRPC
received them in. Through protobuf, every byte would be copied three times on each side
(array to `bytes`, into the message, into the serialized string, and back the same way),
which cost more than the rest of a round trip's work on the server. `encode_messages`
writes exactly the bytes protobuf would, and `decoder` hands anything unusual to protobuf,
so peers that use the generated code work as before.
"""

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import scipy.linalg.blas
from google.protobuf.message import Message

from omnikeras.parameter_server.errors import InvalidArgument, NotFound, ResourceExhausted, shown
from omnikeras.v1 import parameter_server_pb2 as pb

CHUNK_BYTES = 1 << 20
SUPPORTED_DTYPES = frozenset({"float16", "float32", "float64"})
# What a caller may declare of one tensor, before the server holds memory for it.
MAX_RANK = 32
MAX_TENSOR_BYTES = 1 << 34

_M = TypeVar("_M", bound=Message)


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
                f"variable {shown(spec.name)}: dtype {shown(spec.dtype)} is not one of "
                f"{sorted(SUPPORTED_DTYPES)}"
            )
        if len(spec.shape) > MAX_RANK or any(d < 0 for d in spec.shape):
            raise InvalidArgument(f"variable {shown(spec.name)}: a shape of {MAX_RANK} non-negative dimensions at most")
        declared = math.prod(spec.shape) * np.dtype(spec.dtype).itemsize
        if declared > MAX_TENSOR_BYTES:
            raise ResourceExhausted(
                f"variable {shown(spec.name)}: {declared} bytes, above the server's {MAX_TENSOR_BYTES} per tensor"
            )
        return cls(spec.name, np.dtype(spec.dtype).newbyteorder("<"), tuple(spec.shape))

    def to_proto(self) -> pb.VariableSpec:
        return pb.VariableSpec(name=self.name, dtype=self.dtype.name, shape=self.shape)


def little_endian(array: np.ndarray) -> np.ndarray:
    """Returns `array` as a C-contiguous little-endian array, copying only if needed."""
    dtype = array.dtype.newbyteorder("<")
    # ascontiguousarray alone would turn a 0-d array into shape (1,).
    return np.ascontiguousarray(array, dtype=dtype).reshape(array.shape)


def all_finite(array: np.ndarray) -> bool:
    """Whether `array` holds no NaN or Inf."""
    return magnitude(array) is not None


def magnitude(array: np.ndarray) -> float | None:
    """The sum of `array`'s absolute values, a bound on the largest of them (Inf when
    the sum overflows); None when `array` holds NaN or Inf.

    One pass with no temporary (BLAS asum: faster than NumPy's pairwise sum on one
    thread); only when the sum is not finite (NaN, Inf, or an overflow of large finite
    values) is the exact check needed.
    """
    total = abs_sum(array)
    if math.isfinite(total):
        return total
    return math.inf if np.isfinite(array).all() else None


def total_magnitude(magnitudes: Mapping[str, float] | float) -> float:
    """The sum of gradients' sums of magnitudes, given each (by variable) or already
    summed."""
    return magnitudes if isinstance(magnitudes, float) else sum(magnitudes.values())


def abs_sum(array: np.ndarray) -> float:
    """The sum of `array`'s absolute values (Inf when it overflows): a bound on its
    largest one, in one pass with no temporary."""
    asum = _ASUM.get(array.dtype) if array.dtype.isnative and array.flags.c_contiguous else None
    if asum is not None and array.size:
        return float(asum(array.reshape(-1)))
    # Summed in float64: a float16 sum overflows long before its values do.
    return float(np.abs(array).sum(dtype=np.float64))


_ASUM = {np.dtype(np.float32): scipy.linalg.blas.sasum, np.dtype(np.float64): scipy.linalg.blas.dasum}


def encode(
    arrays: Mapping[str, np.ndarray], chunk_bytes: int = CHUNK_BYTES
) -> Iterator[pb.TensorChunk]:
    """Yields the chunks of every array, in the mapping's order."""
    for spec, offset, data in _slices(arrays, chunk_bytes):
        yield pb.TensorChunk(spec=spec, offset=offset, data=data.tobytes())


def encode_messages(
    message_type: type[Message], arrays: Mapping[str, np.ndarray], chunk_bytes: int = CHUNK_BYTES
) -> Iterator[bytes]:
    """Yields `message_type(chunk=chunk).SerializeToString()` for every chunk of
    `encode(arrays, chunk_bytes)`, the same bytes, with each chunk's data copied once."""
    chunk_key = _key(_chunk_field(message_type), _LENGTH_DELIMITED)
    for spec, offset, data in _slices(arrays, chunk_bytes):
        head = pb.TensorChunk(spec=spec, offset=offset).SerializeToString()
        # Protobuf leaves out an empty bytes field, and so does this.
        data_key = _DATA_KEY + _varint(len(data)) if len(data) else b""
        body_length = len(head) + len(data_key) + len(data)
        yield b"".join((chunk_key, _varint(body_length), head, data_key, data))


def serialize(message: Message | bytes) -> bytes:
    """The gRPC serializer of the tensor streams: messages from `encode_messages` are
    already serialized, any other is serialized by protobuf."""
    return message if isinstance(message, bytes) else message.SerializeToString()


@dataclass(frozen=True)
class Received(Generic[_M]):
    """A message of a tensor stream as `decoder` delivers it."""

    message: _M
    # The bytes of `message.chunk.data`, which the message itself may leave empty: a view
    # of the buffer gRPC received them in.
    data: memoryview


def decoder(message_type: type[_M]) -> Callable[[bytes], Received[_M]]:
    """The gRPC deserializer of a message type with a `chunk` field: a message that holds
    one chunk and nothing else comes without a copy of the chunk's data; any other is
    parsed by protobuf."""
    chunk_number = _chunk_field(message_type)

    def decode(serialized: bytes) -> Received[_M]:
        buffer = memoryview(serialized)
        try:
            fields = _fields(buffer)
            if len(fields) == 1 and fields[0].key == (chunk_number, _LENGTH_DELIMITED):
                body = buffer[fields[0].value]
                head: list[memoryview] = []
                data = buffer[0:0]
                for field in _fields(body):
                    if field.key == (_DATA_NUMBER, _LENGTH_DELIMITED):
                        data = body[field.value]  # The last one wins, as in protobuf.
                    else:
                        head.append(body[field.whole])
                chunk = pb.TensorChunk.FromString(b"".join(head))
                return Received(message_type(chunk=chunk), data)
        except _Unparsed:
            pass
        message = message_type.FromString(serialized)
        return Received(message, memoryview(message.chunk.data))  # type: ignore[attr-defined]

    return decode


def _slices(
    arrays: Mapping[str, np.ndarray], chunk_bytes: int
) -> Iterator[tuple[pb.VariableSpec | None, int, memoryview]]:
    """(spec on a tensor's first chunk only, byte offset, bytes) of every chunk."""
    for name, array in arrays.items():
        array = little_endian(array)
        if array.dtype.name not in SUPPORTED_DTYPES:
            raise ValueError(f"{name!r}: dtype {array.dtype} is not one of {sorted(SUPPORTED_DTYPES)}")
        raw = memoryview(array.reshape(-1)).cast("B")  # type: ignore[arg-type]  # NumPy arrays are buffers
        yield VariableSpec.of(name, array).to_proto(), 0, raw[:chunk_bytes]
        for offset in range(chunk_bytes, len(raw), chunk_bytes):
            yield None, offset, raw[offset : offset + chunk_bytes]


# The protobuf wire format, as far as `encode_messages` and `decoder` need it
# (https://protobuf.dev/programming-guides/encoding/).

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
_DATA_NUMBER = pb.TensorChunk.DESCRIPTOR.fields_by_name["data"].number


class _Unparsed(Exception):
    """Raised on what the fast path leaves to protobuf: a malformed message, or groups."""


@dataclass(frozen=True)
class _Field:
    key: tuple[int, int]  # field number, wire type
    whole: slice  # the key and the value
    value: slice  # the value only (for a length-delimited field, without its length)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


_DATA_KEY = _key(_DATA_NUMBER, _LENGTH_DELIMITED)


def _read_varint(buffer: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 64 and position < len(buffer):
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    raise _Unparsed


def _fields(buffer: memoryview) -> list[_Field]:
    fields = []
    position = 0
    while position < len(buffer):
        start = position
        key, position = _read_varint(buffer, position)
        wire_type = key & 7
        if wire_type == _VARINT:
            _, position = _read_varint(buffer, position)
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _read_varint(buffer, position)
        elif wire_type in (_FIXED64, _FIXED32):
            length = 8 if wire_type == _FIXED64 else 4
        else:
            raise _Unparsed
        value_start = position
        if wire_type != _VARINT:
            position += length
        if position > len(buffer):
            raise _Unparsed
        fields.append(_Field((key >> 3, wire_type), slice(start, position), slice(value_start, position)))
    return fields


def _chunk_field(message_type: type[Message]) -> int:
    return message_type.DESCRIPTOR.fields_by_name["chunk"].number


class TensorAssembler:
    """Rebuilds arrays from a chunk stream.

    With `expected` specs, a chunk of an unknown variable is NOT_FOUND, and a wrong dtype or
    shape, a byte out of place, a tensor cut short or overrunning, or a variable missing at
    the end is INVALID_ARGUMENT. Without them (the model's first upload) any supported spec
    is taken.

    `inspect`, if given, is called with a variable's name and the elements each chunk
    completes (a view into the array being rebuilt), so that they can be examined while
    the chunks that follow are still in flight, and while they are still in the CPU cache.

    `into`, if given, holds arrays to rebuild into, by name, where one has the variable's
    dtype and shape: a new array of 100 MB costs 25,000 page faults as it is first
    written, more than copying into it.
    """

    def __init__(
        self,
        expected: Mapping[str, VariableSpec] | None = None,
        inspect: Callable[[str, np.ndarray], None] | None = None,
        into: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self._expected = expected
        self._inspect = inspect
        self._into = into or {}
        self.arrays: dict[str, np.ndarray] = {}
        self._current: tuple[VariableSpec, np.ndarray] | None = None
        self._filled = 0
        self._inspected = 0

    def add(self, chunk: pb.TensorChunk, data: memoryview | None = None) -> None:
        """Takes one chunk; `data`, when given, stands for `chunk.data` (see `Received`)."""
        if data is None:
            data = memoryview(chunk.data)
        if chunk.HasField("spec"):
            self._finish_current()
            self._start(VariableSpec.from_proto(chunk.spec))
        if self._current is None:
            raise InvalidArgument("a tensor chunk arrived before any variable spec")
        spec, raw = self._current
        if chunk.offset != self._filled:
            raise InvalidArgument(
                f"variable {shown(spec.name)}: chunk at byte {chunk.offset}, expected {self._filled}"
            )
        end = self._filled + len(data)
        if end > len(raw):
            raise InvalidArgument(
                f"variable {shown(spec.name)}: {end} bytes sent, its shape holds {len(raw)}"
            )
        raw[self._filled : end] = np.frombuffer(data, dtype=np.uint8)
        self._filled = end
        if self._inspect is not None:
            # A chunk may end inside an element, which then waits for the next chunk.
            whole = end - end % spec.dtype.itemsize
            if whole > self._inspected:
                self._inspect(spec.name, raw[self._inspected : whole].view(spec.dtype))
                self._inspected = whole

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
            raise InvalidArgument(f"variable {shown(spec.name)} sent twice")
        if self._expected is not None:
            expected = self._expected.get(spec.name)
            if expected is None:
                raise NotFound(f"unknown variable {shown(spec.name)}")
            if spec.dtype != expected.dtype or spec.shape != expected.shape:
                raise InvalidArgument(
                    f"variable {shown(spec.name)}: got {spec.dtype.name}{list(spec.shape)[:MAX_RANK]}, "
                    f"expected {expected.dtype.name}{list(expected.shape)}"
                )
        array = self._into.get(spec.name)
        if array is None or (array.dtype, array.shape) != (spec.dtype, spec.shape) or not _writable_whole(array):
            array = np.empty(spec.shape, dtype=spec.dtype)
        self._current = (spec, array.reshape(-1).view(np.uint8))
        self._inspected = 0
        self.arrays[spec.name] = array

    def _finish_current(self) -> None:
        if self._current is None:
            return
        spec, raw = self._current
        if self._filled != len(raw):
            raise InvalidArgument(
                f"variable {shown(spec.name)}: stream cut short at byte {self._filled} of {len(raw)}"
            )
        self._current = None
        self._filled = 0


def _writable_whole(array: np.ndarray) -> bool:
    return bool(array.flags.c_contiguous and array.flags.writeable)


def assemble(
    chunks: Iterable[pb.TensorChunk], expected: Mapping[str, VariableSpec] | None = None
) -> dict[str, np.ndarray]:
    assembler = TensorAssembler(expected)
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.finish()
