"""Runs the parameter server: the gRPC service, health checks, auth and checkpoints."""

import logging
import os
import pathlib
import secrets
import threading
from concurrent import futures

import grpc
import threadpoolctl
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from omnikeras.parameter_server import auth, shared_memory
from omnikeras.parameter_server.checkpoints import CheckpointDirectory
from omnikeras.parameter_server.groups import MAX_WAITING_FOR_MODEL, MAX_WORKERS, GroupCoordinator
from omnikeras.parameter_server.model_state import ModelState
from omnikeras.parameter_server.servicer import ParameterServerServicer, add_to_server
from omnikeras.parameter_server.shared_memory_server import SharedMemoryServer
from omnikeras.parameter_server.update_rule import Hyperparameters

logger = logging.getLogger(__name__)

SERVICE_NAME = "omnikeras.v1.ParameterServer"
# Every registered worker may wait in a group step and as many calls for the model, with
# threads to spare for every other call. A call beyond them is refused at once
# (RESOURCE_EXHAUSTED) rather than queued behind calls that wait.
_THREADS = MAX_WORKERS + MAX_WAITING_FOR_MODEL + 64


class ParameterServer:
    """A parameter server for grouped asynchronous SGD, served over gRPC.

    Holds a model's weights and applies one update per group step, asynchronously across
    groups. A server started on a checkpoint directory that holds checkpoints resumes from
    the newest one. Workers on the same host exchange gradients and weights with it
    through shared memory (on Linux); the others, and every other call, use gRPC.

    Starting a server limits BLAS to one thread in its process: the update is one pass
    over memory per operation, which more threads hardly speed up, and idle BLAS
    threads spin on the cores that the workers of the same host compute on.

    Args:
        host: Address to listen on. Defaults to `"127.0.0.1"`; use `"0.0.0.0"` to serve
            other machines.
        port: Port to listen on; 0 (the default) picks a free one (see `port`).
        num_groups: Number of compute groups. Defaults to 1 (synchronous SGD).
        hyperparameters: Update rule settings until a worker initialises the model with
            its own. Defaults to `Hyperparameters()`.
        group_timeout: Seconds a group step waits for its last member before it goes ahead
            without it and drops it. Defaults to 60.
        checkpoint_dir: Directory for checkpoints; None (the default) disables them.
        checkpoint_every: Seconds between automatic checkpoints; None (the default) writes
            them only on request and at shutdown.
        token: Shared secret that every call must carry, health checks included; None
            (the default) lets any caller in.
        health_port: A port of its own for the standard `grpc.health.v1` service, open
            without the token, for orchestrators that cannot send one; None (the default)
            serves health checks on `port` only. Keep it reachable by the orchestrator
            alone: grpcio keeps memory for calls it cannot decode.
        tls_cert, tls_key: PEM files to serve TLS with; None (the default) serves plain
            text.

    Example:

    >>> server = ParameterServer(num_groups=2)
    >>> port = server.start()
    >>> server.stop()
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        num_groups: int = 1,
        hyperparameters: Hyperparameters | None = None,
        group_timeout: float = 60.0,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: float | None = None,
        token: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        health_port: int | None = None,
        measure_momentum: bool = False,
    ) -> None:
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both a certificate and a key")
        if checkpoint_every is not None and checkpoint_dir is None:
            raise ValueError("checkpoint_every needs a checkpoint_dir")
        self.host = host
        self.port = port
        self.coordinator = GroupCoordinator(
            ModelState(hyperparameters or Hyperparameters()), num_groups, group_timeout, measure_momentum
        )
        self.checkpoints = CheckpointDirectory(checkpoint_dir) if checkpoint_dir else None
        self.checkpoint_every = checkpoint_every
        self.token = token
        self.tls = (tls_cert, tls_key) if tls_cert and tls_key else None
        self.health_port = health_port
        self._server: grpc.Server | None = None
        self._health_server: grpc.Server | None = None
        self._shared_memory: SharedMemoryServer | None = None
        self._stopping = threading.Event()
        self._checkpointer: threading.Thread | None = None
        self._last_saved_version = -1

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> int:
        """Restores the newest checkpoint, if any, and starts serving; returns the port."""
        threadpoolctl.threadpool_limits(limits=1, user_api="blas")
        self._restore()
        interceptors = [auth.TokenInterceptor(self.token)] if self.token else []
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="ps-call"),
            interceptors=interceptors,
            maximum_concurrent_rpcs=_THREADS,
        )
        server_id = secrets.token_hex(16)
        if shared_memory.available():
            self._shared_memory = SharedMemoryServer(self.coordinator, server_id, self.token)
        add_to_server(
            ParameterServerServicer(
                self.coordinator,
                server_id,
                self.save_checkpoint if self.checkpoints else None,
                self._shared_memory.socket_path if self._shared_memory else "",
            ),
            server,
        )
        health_servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        bind = f"{self.host}:{self.port}"
        if self.tls:
            self.port = server.add_secure_port(bind, auth.server_credentials(*self.tls))
        else:
            self.port = server.add_insecure_port(bind)
        if self.health_port is not None:
            self._health_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="ps-health"))
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self._health_server)
            self.health_port = self._health_server.add_insecure_port(f"{self.host}:{self.health_port}")
            self._health_server.start()
        server.start()
        for service in ("", SERVICE_NAME):
            health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        if self.checkpoint_every:
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, daemon=True)
            self._checkpointer.start()
        logger.info("parameter server listening on %s%s", self.address, " with TLS" if self.tls else "")
        return self.port

    def stop(self, grace: float = 1.0) -> None:
        """Stops serving and writes a last checkpoint if the model changed since the last."""
        self._stopping.set()
        if self._shared_memory is not None:
            self._shared_memory.close()
        if self._server is not None:
            self._server.stop(grace).wait()
        if self._health_server is not None:
            self._health_server.stop(grace).wait()
        if self._checkpointer is not None:
            self._checkpointer.join()
        model = self.coordinator.model
        if self.checkpoints and model.initialized and model.version != self._last_saved_version:
            self.save_checkpoint()

    def wait(self) -> None:
        if self._server is not None:
            self._server.wait_for_termination()

    def save_checkpoint(self) -> tuple[pathlib.Path, int]:
        """Writes a checkpoint now; returns its path and model version."""
        if self.checkpoints is None:
            raise ValueError("the server has no checkpoint directory")
        state = self.coordinator.checkpoint_state()
        path = self.checkpoints.save(state)
        self._last_saved_version = state.version
        logger.info("checkpoint of version %d written to %s", state.version, path)
        return path, state.version

    def _restore(self) -> None:
        if self.checkpoints is None:
            return
        latest = self.checkpoints.latest()
        if latest is None:
            return
        state = self.checkpoints.load(latest)
        self.coordinator.restore(state)
        self._last_saved_version = state.version
        logger.info("resumed from %s (version %d)", latest, state.version)

    def _checkpoint_loop(self) -> None:
        assert self.checkpoint_every is not None
        # The first checkpoint follows the model's arrival: a server restarted any time
        # later finds the model there.
        while not self._stopping.wait(self.checkpoint_every if self._last_saved_version >= 0 else 0.5):
            model = self.coordinator.model
            if not model.initialized or model.version == self._last_saved_version:
                continue
            try:
                self.save_checkpoint()
            except OSError:
                logger.exception("periodic checkpoint failed; the next one will retry")
