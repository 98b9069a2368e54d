"""The shared-memory exchange between a worker and a parameter server on the same host:
the segment's layout and the messages on the Unix socket, common to both sides.

Over gRPC, a push_pull of a small model costs more in gRPC's own machinery (threads,
streams, condition waits) than in moving its bytes. A worker on the server's host writes
its gradients into a segment the server maps as well, rings with a `PushHeader` on a Unix
socket, and finds the new weights in the segment when the `SharedMemoryReply` comes back:
one copy of each tensor per side and two small messages per step. The wire format is in
`protos/omnikeras/v1/parameter_server.proto`.
"""

import hashlib
import mmap
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from omnikeras.parameter_server.buffer_layout import ALIGNMENT, BufferLayout, FlatArrays
from omnikeras.parameter_server.errors import Refusal
from omnikeras.v1 import parameter_server_pb2 as pb

_M = TypeVar("_M", bound=Message)

# See `SegmentLayout`.
_WEIGHT_SKEW = 16
# The largest message on the socket: a header or a reply, never tensor bytes.
MAX_MESSAGE_BYTES = 1 << 16


@dataclass(frozen=True)
class SegmentLayout(BufferLayout):
    """A segment: the gradient region, then the weight region, each laid out as a
    `BufferLayout`, 64 bytes apart at least.

    The weights start 16 bytes past a 64-byte boundary. TensorFlow takes an array that a
    `numpy_function` returns without a copy when it lies on a 64-byte boundary, and may
    then make that memory a variable's storage, which the next push would overwrite; off
    the boundary, it copies the weights into memory of its own, once.

    Example:

    >>> layout = SegmentLayout.of({"w": VariableSpec("w", np.dtype("<f4"), (3,))})
    >>> layout.segment_bytes
    208
    """

    @property
    def weights_start(self) -> int:
        return self.region_bytes + ALIGNMENT + _WEIGHT_SKEW

    @property
    def segment_bytes(self) -> int:
        return self.weights_start + self.region_bytes

    @property
    def digest(self) -> bytes:
        """SHA-256 of the variables' places and the weights' start: equal on both sides,
        or the two disagree on the model."""
        return hashlib.sha256(self.variables_digest + f";weights@{self.weights_start}".encode()).digest()

    def views(self, segment: mmap.mmap) -> tuple[FlatArrays, FlatArrays]:
        """The gradient arrays and the weight arrays, as views of `segment`."""
        return self.arrays(segment), self.arrays(segment, self.weights_start)


def available() -> bool:
    """Whether this platform has what the exchange needs (memfd and SCM_RIGHTS: Linux)."""
    return hasattr(socket, "AF_UNIX") and hasattr(socket, "send_fds") and hasattr(os, "memfd_create")


class StatusError(grpc.RpcError):
    """A call over the exchange that ended with a status other than OK, shaped like the
    error the same call raises over gRPC, so that callers handle both alike."""

    def __init__(
        self, code: grpc.StatusCode, details: str, refusal: Refusal = Refusal.UNSPECIFIED
    ) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        # Read by `errors.refusal_of`, as the trailing metadata of a gRPC error.
        self.refusal = refusal

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    @classmethod
    def of(cls, reply: pb.SharedMemoryReply) -> "StatusError":
        return cls(_STATUS_CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.message, Refusal.of(reply.refusal))


_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class PeerClosed(ConnectionError):
    """The other side closed the socket."""


# Every message starts with this byte: a protobuf message may serialize to nothing, and an
# empty packet would read as the peer closing the socket.
_MARK = b"\x01"


def send(connection: socket.socket, message: Message, fds: Sequence[int] = ()) -> None:
    """Sends one message, with `fds` attached when given."""
    data = _MARK + message.SerializeToString()
    if fds:
        socket.send_fds(connection, [data], list(fds))
    else:
        connection.sendall(data)


def receive(connection: socket.socket, message_type: type[_M]) -> _M:
    """One message; raises `PeerClosed` when the peer has gone."""
    return _parse(connection.recv(MAX_MESSAGE_BYTES), message_type)


def receive_with_fds(connection: socket.socket, message_type: type[_M]) -> tuple[_M, list[int]]:
    """One message and the file descriptors attached to it."""
    data, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE_BYTES, 1)
    try:
        return _parse(data, message_type), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _parse(data: bytes, message_type: type[_M]) -> _M:
    if not data:
        raise PeerClosed("the peer closed the shared-memory socket")
    if data[:1] != _MARK:
        raise PeerClosed("the peer does not speak this version of the shared-memory exchange")
    return message_type.FromString(data[1:])


def peer_closed(connection: socket.socket) -> bool:
    """Whether the peer closed its end (without consuming a message)."""
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
