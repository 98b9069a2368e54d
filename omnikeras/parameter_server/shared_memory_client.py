"""The worker side of the shared-memory exchange with one parameter-server shard."""

import mmap
import os
import socket
from collections.abc import Callable, Mapping

import grpc
import numpy as np

from omnikeras.parameter_server import parallel, shared_memory
from omnikeras.parameter_server.buffer_layout import FlatArrays
from omnikeras.parameter_server.shared_memory import SegmentLayout, StatusError
from omnikeras.parameter_server.tensors import VariableSpec
from omnikeras.v1 import parameter_server_pb2 as pb


class SharedMemoryChannel:
    """A segment shared with one server shard, and the socket that rings it.

    Connecting fails with `OSError` where the server is not on this host (its socket is
    not there) and with `StatusError` where it refuses (wrong token, another model): the
    caller then stays on gRPC. Once connected, a broken socket raises `ConnectionError`
    and the channel is closed; a reply that misses `timeout` closes it too, since a late
    reply would answer the next push.

    Args:
        socket_path: `DescribeReply.shared_memory_socket` of the shard.
        server_id: `DescribeReply.server_id` of the shard.
        worker_id: The registered worker this channel pushes for.
        specs: The shard's variables.
        token: The shard's token, or None.
        timeout: Seconds to wait for a reply, group step included.
    """

    def __init__(
        self,
        socket_path: str,
        server_id: str,
        worker_id: int,
        specs: Mapping[str, VariableSpec],
        token: str | None,
        timeout: float,
    ) -> None:
        layout = SegmentLayout.of(specs)
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._connection.settimeout(timeout)
        fd = os.memfd_create("omnikeras-exchange", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, layout.segment_bytes)
            self._segment = mmap.mmap(fd, layout.segment_bytes)
            self._connection.connect(socket_path)
            hello = pb.SharedMemoryHello(
                worker_id=worker_id, token=token or "", server_id=server_id, layout_digest=layout.digest
            )
            shared_memory.send(self._connection, hello, fds=[fd])
            answer = shared_memory.receive(self._connection, pb.SharedMemoryReply)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(fd)
        if answer.code:
            self.close()
            raise StatusError.of(answer)
        self.gradients, self.weights = layout.views(self._segment)
        region = self.weights.region
        self._read_only_weights = FlatArrays(
            {name: _read_only(w) for name, w in self.weights.items()},
            layout,
            None if region is None else _read_only(region),
        )

    def push_pull(
        self,
        gradients: Mapping[str, np.ndarray],
        header: pb.PushHeader,
        while_waiting: Callable[[], None] = lambda: None,
    ) -> tuple[pb.PushReply, int, FlatArrays]:
        """Pushes `gradients` (every variable of the shard; views that `write` returned
        are in place already) and returns the push's outcome, the weights' version and the
        weights: read-only views of the segment, valid until the next push.
        `while_waiting` runs between the push and the reply's read."""
        if gradients.keys() != self.gradients.keys():
            raise StatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a push carries every variable of the shard: missing {sorted(self.gradients.keys() - gradients.keys())}",
            )
        self.write({name: g for name, g in gradients.items() if g is not self.gradients[name]})
        try:
            shared_memory.send(self._connection, header)
            try:
                while_waiting()
            finally:
                # The reply is read even where the caller's work failed: the next push's
                # would be taken for it otherwise.
                reply = shared_memory.receive(self._connection, pb.SharedMemoryReply)
        except TimeoutError:
            self.close()
            raise StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, "no reply from the server in time") from None
        except OSError:
            self.close()
            raise
        if reply.code:
            raise StatusError.of(reply)
        return reply.push, reply.model_version, self._read_only_weights

    def write(self, gradients: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Copies `gradients` (some of the shard's variables) into the segment and returns
        their views there: passed to `push_pull` in their place, they are not copied again."""
        for name, gradient in gradients.items():
            target = self.gradients.get(name)
            if target is None:
                raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, f"the shard holds no variable {name!r}")
            if gradient.shape != target.shape or gradient.dtype != target.dtype:
                raise StatusError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"variable {name!r}: got {gradient.dtype.name}{list(gradient.shape)}, "
                    f"expected {target.dtype.name}{list(target.shape)}",
                )
            parallel.copy(target, gradient)
        return {name: self.gradients[name] for name in gradients}

    def close(self) -> None:
        self._connection.close()


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view
