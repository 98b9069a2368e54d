"""Property-based fuzzing of a real `omnikeras ps` process: malformed requests and chunk
streams for every RPC get a gRPC status (never UNKNOWN or INTERNAL), the server stays up,
holds no memory a header merely claims, and a refused call changes nothing."""

import math
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnikeras import Hyperparameters, ParameterServerClient
from omnikeras.v1 import parameter_server_pb2 as pb
from omnikeras.v1 import parameter_server_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

WEIGHTS = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
# A status is an answer; UNKNOWN and INTERNAL mean that the server failed to give one.
NOT_AN_ANSWER = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
FUZZ = settings(
    max_examples=2500, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow], database=None
)


class Cluster:
    def __init__(self, start_server) -> None:
        self.server = start_server("--group-timeout", "1")
        self.client = ParameterServerClient([self.server.address])
        self.worker = self.client.register().worker_id
        self.client.init_model(WEIGHTS, Hyperparameters(0.1))
        self.stub = pb_grpc.ParameterServerStub(grpc.insecure_channel(self.server.address))
        self.baseline_rss = self.server.rss_mib()

    def state(self) -> tuple:
        """What a refused call must leave as it was."""
        stats = self.client.stats()[0]
        weights = self.client.pull().weights
        return (
            stats.model_version,
            stats.hyperparameters,
            tuple((g.group, tuple(g.members)) for g in stats.groups),
            tuple((name, weights[name].tobytes()) for name in sorted(weights)),
        )

    def call(self, rpc) -> grpc.StatusCode:
        """Runs one call; checks that it was answered and, if refused, changed nothing."""
        before = self.state()
        try:
            reply = rpc(self.stub)
            if isinstance(reply, Iterator):
                list(reply)
        except grpc.RpcError as error:
            assert error.code() not in NOT_AN_ANSWER, error.details()
            assert self.state() == before, f"refused with {error.code()} but changed the state"
            return error.code()
        return grpc.StatusCode.OK


def _outlived(cluster: Cluster) -> None:
    """The server is up, answers, and holds no memory a header merely claimed."""
    assert cluster.server.process.poll() is None
    assert cluster.server.rss_mib() < cluster.baseline_rss + 200
    assert cluster.client.stats()[0].model_version >= 0


names = st.sampled_from(["w", "b", "x", "", "w" * 300]) | st.text(max_size=8)
dtypes = st.sampled_from(["float32", "float64", "float16", "int8", "complex64", ""])
shapes = st.lists(st.sampled_from([0, 1, 2, 3, 7, 2**31, 2**40, -1]), max_size=5)
chunks = st.builds(
    lambda name, dtype, shape, offset, data: pb.TensorChunk(
        spec=pb.VariableSpec(name=name, dtype=dtype, shape=shape), offset=offset, data=data
    ),
    names, dtypes, shapes, st.sampled_from([0, 0, 0, 4, 12, -1, 2**40]), st.binary(max_size=40),
)


def _headers(worker: int) -> st.SearchStrategy[pb.PushHeader]:
    return st.builds(
        pb.PushHeader,
        worker_id=st.sampled_from([worker, 0, 999, -1, 2**63 - 1]),
        step=st.integers(-2, 4),
        model_version=st.integers(-1, 3),
        example_count=st.integers(-1, 3),
    )


def _good_chunks() -> st.SearchStrategy[list[pb.TensorChunk]]:
    """The chunks of a well-formed gradient, sometimes cut short, reordered or doubled."""
    from omnikeras.parameter_server import tensors

    whole = list(tensors.encode({name: np.full_like(w, 0.01) for name, w in WEIGHTS.items()}))
    return st.lists(st.sampled_from(whole), max_size=4)


def test_every_tensor_stream_is_answered_and_a_refused_one_changes_nothing(start_server) -> None:
    cluster = Cluster(start_server)
    _fuzz(cluster, _tensor_stream)
    _outlived(cluster)


def test_every_control_call_is_answered_and_a_refused_one_changes_nothing(start_server) -> None:
    cluster = Cluster(start_server)
    _fuzz(cluster, _control_call)
    _outlived(cluster)


def _fuzz(cluster: Cluster, case: Callable[[Cluster, st.DataObject], None]) -> None:
    @FUZZ
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        case(cluster, data)

    one()


def _tensor_stream(cluster: Cluster, data) -> None:
    rpc = data.draw(st.sampled_from(["Push", "PushPull", "InitModel"]))
    items = data.draw(st.lists(chunks, max_size=4) | _good_chunks())
    if rpc == "InitModel":
        lead = data.draw(st.sampled_from([
            pb.InitModelRequest(hyperparameters=pb.Hyperparameters(learning_rate=0.1)),
            pb.InitModelRequest(hyperparameters=pb.Hyperparameters(learning_rate=-1)),
            None,
        ]))
        stream = [lead] if lead is not None else []
        stream += [pb.InitModelRequest(chunk=c) for c in items]
        cluster.call(lambda stub: stub.InitModel(iter(stream), timeout=30))
        return
    header = data.draw(st.none() | _headers(cluster.worker))
    stream = ([pb.PushRequest(header=header)] if header is not None else []) + [pb.PushRequest(chunk=c) for c in items]
    if data.draw(st.booleans()):
        stream.insert(data.draw(st.integers(0, len(stream))), pb.PushRequest(header=data.draw(_headers(cluster.worker))))
    cluster.call(lambda stub: getattr(stub, rpc)(iter(stream), timeout=30))


def _control_call(cluster: Cluster, data) -> None:
    numbers = st.sampled_from([0.0, -1.0, 0.5, 1e39, 1e-50, math.inf, math.nan, 0.1])
    calls = {
        "SetHyperparameters": lambda: pb.SetHyperparametersRequest(hyperparameters=pb.Hyperparameters(
            learning_rate=data.draw(numbers), momentum=data.draw(numbers), weight_decay=data.draw(numbers),
        )),
        "SetGroups": lambda: pb.SetGroupsRequest(
            num_groups=data.draw(st.sampled_from([0, 1, -1, 2**31 - 1, 10**6])),
            assignment=data.draw(st.dictionaries(st.sampled_from([cluster.worker, 999, -1]), st.integers(-1, 3), max_size=2)),
        ),
        "SaveSnapshot": lambda: pb.SnapshotRequest(name=data.draw(names)),
        "RestoreSnapshot": lambda: pb.SnapshotRequest(name=data.draw(names)),
        "DeleteSnapshot": lambda: pb.SnapshotRequest(name=data.draw(names)),
        "Pull": lambda: pb.PullRequest(
            newer_than=data.draw(st.integers(-2**63, 2**63 - 1)), wait_for_model_seconds=data.draw(numbers),
        ),
        "Deregister": lambda: pb.DeregisterRequest(worker_id=data.draw(st.sampled_from([999, -1, 2**63 - 1]))),
        "Register": lambda: pb.RegisterRequest(
            worker_id=data.draw(st.sampled_from([-1, 2**63 - 1, 2**31])), group=data.draw(st.integers(-2, 3)),
            host=data.draw(st.text(max_size=8)),
        ),
    }
    rpc = data.draw(st.sampled_from(sorted(calls)))
    request = calls[rpc]()
    code = cluster.call(lambda stub: getattr(stub, rpc)(request, timeout=30))
    if rpc in ("Register", "Deregister", "Pull") or (rpc == "SetGroups" and request.num_groups > 1):
        # Only refusals here: these would add phantom members or stall the fuzzing.
        assert code != grpc.StatusCode.OK or rpc == "Pull", f"{rpc} {request} was accepted"
