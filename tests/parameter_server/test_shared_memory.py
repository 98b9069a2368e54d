"""The shared-memory segment's layout and the exchange's messages."""

import mmap
import os
import pathlib
import socket
import tempfile
import time

import grpc
import numpy as np
import pytest

from omnikeras.parameter_server import Hyperparameters, shared_memory
from omnikeras.parameter_server.errors import NonFinite
from omnikeras.parameter_server.groups import GroupCoordinator
from omnikeras.parameter_server.model_state import ModelState
from omnikeras.parameter_server.shared_memory import SegmentLayout, StatusError
from omnikeras.parameter_server.shared_memory_server import (
    DIRECTORY_PREFIX,
    SOCKET_NAME,
    SharedMemoryServer,
    _magnitudes,
)
from omnikeras.parameter_server.tensors import VariableSpec
from omnikeras.v1 import parameter_server_pb2 as pb


def _specs(**shapes: tuple[int, ...]) -> dict[str, VariableSpec]:
    return {name: VariableSpec(name, np.dtype("<f4"), shape) for name, shape in shapes.items()}


def test_variables_are_sorted_by_name_and_start_on_cache_lines() -> None:
    layout = SegmentLayout.of(_specs(b=(3,), a=(5, 7), c=()))
    assert [s.name for s in layout.specs] == ["a", "b", "c"]
    # 140 bytes round up to 192, 12 bytes to 64, 4 bytes to 64.
    assert layout.offsets == (0, 192, 256)
    assert layout.region_bytes == 320
    # The weights begin 16 bytes past the first cache line after the gradients.
    assert layout.weights_start == 400
    assert layout.segment_bytes == 720


def test_the_two_regions_hold_every_variable_without_overlap() -> None:
    layout = SegmentLayout.of(_specs(a=(5, 7), b=(3,), c=()))
    segment = mmap.mmap(-1, layout.segment_bytes)
    gradients, weights = layout.views(segment)
    for index, array in enumerate([*gradients.values(), *weights.values()]):
        array[...] = index + 1
    for index, array in enumerate([*gradients.values(), *weights.values()]):
        assert np.all(array == index + 1)
    assert gradients["a"].shape == (5, 7) and weights["c"].shape == ()
    assert all(array.ctypes.data % 64 == 0 for array in gradients.values())
    assert all(array.ctypes.data % 64 == 16 for array in weights.values())


def test_the_digest_tells_layouts_apart() -> None:
    digest = SegmentLayout.of(_specs(a=(4,), b=(2,))).digest
    assert digest == SegmentLayout.of(_specs(b=(2,), a=(4,))).digest
    assert digest != SegmentLayout.of(_specs(a=(2,), b=(4,))).digest
    assert digest != SegmentLayout.of(_specs(a=(4,), c=(2,))).digest
    other_dtype = {"a": VariableSpec("a", np.dtype("<f8"), (4,)), "b": VariableSpec("b", np.dtype("<f4"), (2,))}
    assert digest != SegmentLayout.of(other_dtype).digest


def test_the_check_reads_a_segment_s_gradients_in_one_pass_whatever_its_padding_holds() -> None:
    layout = SegmentLayout.of(_specs(a=(5, 7), b=(3,), c=()))
    gradients, _ = layout.views(mmap.mmap(-1, layout.segment_bytes))
    assert gradients.region is not None and layout.padding.size
    gradients.region[:] = np.nan
    for index, array in enumerate(gradients.values()):
        array[...] = -(index + 1)
    # The padding is the worker's: zeroed, not read.
    assert _magnitudes(gradients) == 35 * 1 + 3 * 2 + 1 * 3
    assert np.all(gradients.region[layout.padding] == 0)
    gradients["b"][1] = np.inf
    with pytest.raises(NonFinite, match="gradient 'b' holds NaN or Inf"):
        _magnitudes(gradients)


def test_messages_survive_the_socket_even_when_empty() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    shared_memory.send(left, pb.SharedMemoryReply())
    assert shared_memory.receive(right, pb.SharedMemoryReply) == pb.SharedMemoryReply()
    shared_memory.send(left, pb.PushHeader(worker_id=3, step=9))
    assert shared_memory.receive(right, pb.PushHeader).step == 9
    left.close()
    assert shared_memory.peer_closed(right)
    with pytest.raises(shared_memory.PeerClosed):
        shared_memory.receive(right, pb.PushHeader)


def test_a_status_reads_like_a_grpc_error() -> None:
    error = StatusError.of(pb.SharedMemoryReply(code=grpc.StatusCode.ABORTED.value[0], message="restored"))
    assert isinstance(error, grpc.RpcError)
    assert error.code() == grpc.StatusCode.ABORTED
    assert error.details() == "restored"


def test_a_server_removes_the_directories_of_servers_killed_before_they_closed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    listening = []

    def made(name: str, bound: bool, listens: bool = False, age: float = 3600.0) -> pathlib.Path:
        directory = tmp_path / f"{DIRECTORY_PREFIX}{name}"
        directory.mkdir()
        if bound:
            server_socket = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            server_socket.bind(str(directory / SOCKET_NAME))
            if listens:
                server_socket.listen()
                listening.append(server_socket)
            else:
                server_socket.close()
        os.utime(directory, (time.time() - age,) * 2)
        return directory

    killed, unbound = made("killed", bound=True), made("unbound", bound=False)
    starting, live = made("starting", bound=True, age=1.0), made("live", bound=True, listens=True)
    log = tmp_path / f"{DIRECTORY_PREFIX}server.log"
    log.write_text("a server's log")
    server = SharedMemoryServer(GroupCoordinator(ModelState(Hyperparameters())), "server")
    try:
        assert not killed.exists() and not unbound.exists()
        assert starting.exists() and live.exists() and log.exists()
        assert pathlib.Path(server.socket_path).parent.parent == tmp_path
    finally:
        server.close()
        for server_socket in listening:
            server_socket.close()
    assert not pathlib.Path(server.socket_path).parent.exists()
