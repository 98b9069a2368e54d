"""The server side of the shared-memory exchange: a Unix socket that workers on this host
connect to, and one thread per connected worker that serves its push_pulls."""

import hmac
import logging
import mmap
import os
import pathlib
import shutil
import socket
import stat
import tempfile
import threading
import time

import grpc

from omnikeras.parameter_server import shared_memory, tensors
from omnikeras.parameter_server.buffer_layout import FlatArrays
from omnikeras.parameter_server.errors import (
    FailedPrecondition,
    InvalidArgument,
    NonFinite,
    ParameterServerError,
)
from omnikeras.parameter_server.groups import MAX_WORKERS, GroupCoordinator
from omnikeras.parameter_server.shared_memory import SegmentLayout
from omnikeras.v1 import parameter_server_pb2 as pb

logger = logging.getLogger(__name__)

DIRECTORY_PREFIX = "omnikeras-ps-"
SOCKET_NAME = "exchange.sock"
# A server may not listen yet this long after it made its directory.
STALE_AFTER_SECONDS = 60.0


class _Unauthenticated(ParameterServerError):
    code = grpc.StatusCode.UNAUTHENTICATED


class SharedMemoryServer:
    """Listens on a Unix socket in a private directory and serves the workers that connect.

    Args:
        coordinator: The groups and the model the pushes go to.
        server_id: The id `Describe` reports; a worker's hello must name it.
        token: The server's token, which a hello must carry; None accepts any hello.
    """

    def __init__(self, coordinator: GroupCoordinator, server_id: str, token: str | None = None) -> None:
        self.coordinator = coordinator
        self.server_id = server_id
        self._token = token
        remove_stale_directories(pathlib.Path(tempfile.gettempdir()))
        # Only this user may enter the directory, so only this user reaches the socket.
        self._directory = tempfile.mkdtemp(prefix=DIRECTORY_PREFIX)
        self.socket_path = os.path.join(self._directory, SOCKET_NAME)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(self.socket_path)
        self._listener.listen(64)
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="shared-memory-accept", daemon=True).start()

    def close(self) -> None:
        """Stops accepting, disconnects every worker (they go on over gRPC) and removes
        the socket."""
        with self._lock:
            self._closed = True
            connections = list(self._connections)
        for connection in [self._listener, *connections]:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()
        shutil.rmtree(self._directory, ignore_errors=True)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    connection.close()
                    return
                if len(self._connections) >= MAX_WORKERS:
                    # Each connection holds a thread: the worker goes on over gRPC.
                    connection.close()
                    continue
                self._connections.add(connection)
            threading.Thread(
                target=self._serve, args=(connection,), name="shared-memory-worker", daemon=True
            ).start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            worker_id, gradients, weights = self._welcome(connection)
            while True:
                header = shared_memory.receive(connection, pb.PushHeader)
                shared_memory.send(connection, self._push_pull(connection, worker_id, header, gradients, weights))
        except (OSError, shared_memory.PeerClosed):
            pass  # the worker left, or the server is closing
        except Exception:
            logger.exception("shared-memory exchange failed; the worker goes on over gRPC")
        finally:
            with self._lock:
                self._connections.discard(connection)
            connection.close()

    def _welcome(self, connection: socket.socket) -> tuple[int, FlatArrays, FlatArrays]:
        """Reads the hello and maps the worker's segment; answers the hello either way."""
        hello, fds = shared_memory.receive_with_fds(connection, pb.SharedMemoryHello)
        try:
            if self._token is not None and not hmac.compare_digest(hello.token.encode(), self._token.encode()):
                raise _Unauthenticated("missing or wrong token")
            if hello.server_id != self.server_id:
                raise FailedPrecondition("the hello names another server")
            self.coordinator.check_pusher(hello.worker_id)
            layout = SegmentLayout.of(self.coordinator.model.specs)
            if hello.layout_digest != layout.digest:
                raise InvalidArgument("the worker's segment layout differs from the server's variables")
            if len(fds) != 1 or os.fstat(fds[0]).st_size < layout.segment_bytes:
                raise InvalidArgument(f"the hello must carry a segment of {layout.segment_bytes} bytes")
            segment = mmap.mmap(fds[0], layout.segment_bytes)
        except ParameterServerError as error:
            shared_memory.send(connection, _status_reply(error))
            raise shared_memory.PeerClosed(str(error)) from None
        finally:
            for fd in fds:
                os.close(fd)
        shared_memory.send(connection, pb.SharedMemoryReply())
        logger.info("worker %d exchanges through shared memory", hello.worker_id)
        return (hello.worker_id, *layout.views(segment))

    def _push_pull(
        self,
        connection: socket.socket,
        worker_id: int,
        header: pb.PushHeader,
        gradients: FlatArrays,
        weights: FlatArrays,
    ) -> pb.SharedMemoryReply:
        try:
            if header.worker_id != worker_id:
                raise InvalidArgument(f"this connection pushes for worker {worker_id}, not {header.worker_id}")
            self.coordinator.check_pusher(worker_id)
            try:
                magnitudes = _magnitudes(gradients)
            except NonFinite:
                self.coordinator.count_rejected_non_finite()
                raise
            # The group step may use the segment's gradients as scratch space: the worker
            # does not touch them until the reply.
            result = self.coordinator.push(
                worker_id,
                header.step,
                header.model_version,
                header.example_count,
                gradients.copy(),
                caller_gone=lambda: shared_memory.peer_closed(connection),
                batch=header.batch if header.HasField("batch") else None,
                known_layout=header.known_layout_version,
                magnitudes=magnitudes,
                loss=header.loss if header.HasField("loss") else None,
                skip_update=header.skip_update,
                learning_rate=header.learning_rate if header.HasField("learning_rate") else None,
            )
            version = self.coordinator.copy_weights(weights)
        except ParameterServerError as error:
            return _status_reply(error)
        return pb.SharedMemoryReply(push=result.to_proto(), model_version=version)


def _magnitudes(gradients: FlatArrays) -> dict[str, float] | float:
    """The finiteness check of a worker's gradients, and their sums of magnitudes: in one
    pass over their region where they lie in one (its padding, the worker's bytes, zeroed
    first), summed over the variables; otherwise each. Raises `NonFinite` naming a
    gradient that holds NaN or Inf.

    One pass rather than one BLAS call per variable: the calls' own cost grows with the
    number of variables, where the pass grows only with their size."""
    region = gradients.region
    if region is not None:
        padding = gradients.layout.padding
        if padding.size:
            region[padding] = 0
        total = tensors.magnitude(region)
        if total is not None:
            return total
    magnitudes = {}
    for name, gradient in gradients.items():
        magnitude = tensors.magnitude(gradient)
        if magnitude is None:
            raise NonFinite("gradient", name)
        magnitudes[name] = magnitude
    return magnitudes


def remove_stale_directories(parent: pathlib.Path) -> None:
    """Removes this user's socket directories in `parent` whose server is gone: a server
    killed before it could close (SIGKILL, the kernel's out-of-memory killer) leaves its
    directory behind. Gone means that its socket refuses connections, or that it has
    none; directories younger than `STALE_AFTER_SECONDS` are left, since their server may
    not listen yet."""
    now = time.time()
    for directory in parent.glob(f"{DIRECTORY_PREFIX}*"):
        try:
            info = directory.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or now - info.st_mtime < STALE_AFTER_SECONDS:
            continue
        if not _listening(directory / SOCKET_NAME):
            shutil.rmtree(directory, ignore_errors=True)


def _listening(path: pathlib.Path) -> bool:
    """Whether a server listens on the socket at `path`; True where it cannot be told."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


def _status_reply(error: ParameterServerError) -> pb.SharedMemoryReply:
    return pb.SharedMemoryReply(code=error.code.value[0], message=str(error), refusal=pb.Refusal.Name(error.refusal))
