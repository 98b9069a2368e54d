"""What runs on the nodes of a Ray cluster: one actor per parameter server and per worker,
each the supervisor of one process, as the local launcher's children are. The process
dies with its actor; an actor that Ray restarts starts it again, a server on its port and
checkpoints, a worker rejoining its group."""

import dataclasses
import os
import pathlib
import shutil
import tempfile
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import ray

from omnikeras.config import WorkerConfig
from omnikeras.processes import Child, start_parameter_server
from omnikeras.processes.worker import python_command, start_worker

_PORT_FILE = "port"


@dataclass(frozen=True)
class Report:
    """An actor's process as last seen: `start` names which start of it this is."""

    start: str
    returncode: int | None
    stdout: bytes = b""
    stderr: bytes = b""


class _Buffer:
    """Output kept for the launcher, which takes it with each poll."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data = bytearray()

    def write(self, data: bytes) -> int:
        with self._lock:
            self._data += data
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        with self._lock:
            data, self._data = bytes(self._data), bytearray()
        return data


def _reconstructed() -> bool:
    return bool(ray.get_runtime_context().was_current_actor_reconstructed)


class _PrivateFiles:
    """Files in a directory only this user may read, removed with `remove`: the TLS files
    an actor was handed, which need not outlive it."""

    def __init__(self) -> None:
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix="omnikeras-tls-"))

    def write(self, name: str, contents: bytes) -> str:
        path = self.directory / name
        path.write_bytes(contents)
        return str(path)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class ServerActor:
    """Runs `omnikeras ps ARGS` on this node's address, with TLS where `tls` holds a
    certificate and key (PEM); after a restart, on the port it had, from its checkpoints
    in `checkpoint_dir`."""

    def __init__(
        self,
        shard: int,
        args: Sequence[str],
        checkpoint_dir: str,
        log_path: str,
        token: str,
        tls: tuple[bytes, bytes] | None,
    ) -> None:
        self._shard = shard
        self._args = list(args)
        self._files = _PrivateFiles()
        if tls is not None:
            self._args += ["--tls-cert", self._files.write("cert.pem", tls[0]), "--tls-key", self._files.write("key.pem", tls[1])]
        self._checkpoints = pathlib.Path(checkpoint_dir)
        self._checkpoints.mkdir(parents=True, exist_ok=True)
        self._log_path = pathlib.Path(log_path)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._env = dict(os.environ, OMNIKERAS_TOKEN=token)
        self._start("a" if _reconstructed() else "w")

    def _start(self, mode: str) -> None:
        port_file = self._checkpoints / _PORT_FILE
        port = port_file.read_text().strip() if port_file.exists() else "0"
        host = ray.util.get_node_ip_address()
        args = [*self._args, "--checkpoint-dir", str(self._checkpoints), "--host", host, "--port", port]
        self._child, self._address = start_parameter_server(
            args, open(self._log_path, mode), self._env, name=f"parameter server {self._shard}", die_with_parent=True
        )
        port_file.write_text(self._address.rpartition(":")[2])
        self._id = uuid.uuid4().hex

    def address(self) -> str:
        return self._address

    def poll(self) -> Report:
        return Report(self._id, self._child.returncode)

    def restart(self) -> tuple[str, str]:
        """Starts the server again on its port and checkpoints; returns (start, address)."""
        self._child.terminate()
        self._start("a")
        return self._id, self._address

    def stop(self) -> None:
        self._child.terminate()
        self._files.remove()


class WorkerActor:
    """Runs the training script as the worker `config` describes, in `cwd`; the chief's
    output is kept for the launcher's console; it trusts the servers' TLS certificates
    signed by `ca` (PEM), if given. After a restart it rejoins its group at the servers'
    addresses, which it asks of their actors, named in `servers` (in the actor's
    namespace)."""

    def __init__(
        self,
        config: WorkerConfig,
        servers: Sequence[str],
        script: str,
        script_args: Sequence[str],
        settings: dict[str, str],
        log_path: str,
        name: str,
        cwd: str,
        ca: bytes | None,
    ) -> None:
        if os.path.isdir(cwd):
            os.chdir(cwd)
        self._command = python_command((), script, script_args)
        self._settings = settings
        self._log_path = pathlib.Path(log_path)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._name = name
        self._console = (_Buffer(), _Buffer()) if config.is_chief else None
        self._files = _PrivateFiles()
        self._root_cert = self._files.write("ca.pem", ca) if ca is not None else None
        if _reconstructed():
            addresses = ray.get([ray.get_actor(server).address.remote() for server in servers])
            config = dataclasses.replace(config, rejoining=True, parameter_servers=tuple(addresses))
        self._start(config, "a" if config.rejoining else "w")

    def _start(self, config: WorkerConfig, mode: str) -> None:
        config = dataclasses.replace(config, root_cert=self._root_cert)
        self._child: Child = start_worker(
            config, self._name, self._command, self._settings, self._log_path, mode, self._console, die_with_parent=True
        )
        self._id = uuid.uuid4().hex

    def poll(self) -> Report:
        returncode = self._child.returncode
        if self._console is None:
            return Report(self._id, returncode)
        if returncode is not None:
            # Everything it printed comes with the news that it ended.
            self._child.wait_for_output()
        out, err = self._console
        return Report(self._id, returncode, out.take(), err.take())

    def restart(self, config: WorkerConfig) -> str:
        """Starts the script again as `config` says; returns which start this is."""
        self._child.terminate()
        self._start(config, "a")
        return self._id

    def stop(self) -> None:
        self._child.terminate()
        self._files.remove()
