"""The shared-memory segment's layout and the exchange's messages."""

import mmap
import socket

import grpc
import numpy as np
import pytest

from omnikeras.parameter_server import shared_memory
from omnikeras.parameter_server.shared_memory import SegmentLayout, StatusError
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
