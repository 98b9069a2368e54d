"""Malformed or hostile calls get a clear gRPC status and leave the server's state intact."""

import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from omnikeras import Hyperparameters, ParameterServerClient
from omnikeras.parameter_server import tensors
from omnikeras.parameter_server.errors import Refusal, refusal_of
from omnikeras.parameter_server.servicer import MAX_HISTORY_CHARS
from omnikeras.v1 import parameter_server_pb2 as pb
from omnikeras.v1 import parameter_server_pb2_grpc as pb_grpc


@pytest.fixture
def cluster(start_server):
    server = start_server("--group-timeout", "1")
    client = ParameterServerClient([server.address])
    worker = client.register().worker_id
    client.init_model({"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}, Hyperparameters(0.1))
    stub = pb_grpc.ParameterServerStub(grpc.insecure_channel(server.address))
    return client, worker, stub


def _push(stub, header: pb.PushHeader, chunks: list[pb.TensorChunk]) -> pb.PushReply:
    def requests() -> Iterator[pb.PushRequest]:
        yield pb.PushRequest(header=header)
        for chunk in chunks:
            yield pb.PushRequest(chunk=chunk)

    return stub.Push(requests(), timeout=30)


def _chunks(**arrays: np.ndarray) -> list[pb.TensorChunk]:
    return list(tensors.encode(arrays))


GOOD = {"w": np.ones((2, 3), np.float32), "b": np.ones(3, np.float32)}


@pytest.mark.parametrize(
    ("header", "chunks", "code", "message"),
    [
        (dict(worker_id=999), _chunks(**GOOD), grpc.StatusCode.NOT_FOUND, "unknown worker"),
        ({}, _chunks(**GOOD, extra=np.ones(2, np.float32)), grpc.StatusCode.NOT_FOUND, "unknown variable"),
        ({}, _chunks(w=np.ones((3, 2), np.float32), b=GOOD["b"]), grpc.StatusCode.INVALID_ARGUMENT, "expected float32"),
        ({}, _chunks(w=np.ones((2, 3), np.float64), b=GOOD["b"]), grpc.StatusCode.INVALID_ARGUMENT, "got float64"),
        ({}, _chunks(w=GOOD["w"]), grpc.StatusCode.INVALID_ARGUMENT, "without variables"),
        ({}, _chunks(w=np.full((2, 3), np.nan, np.float32), b=GOOD["b"]), grpc.StatusCode.INVALID_ARGUMENT, "NaN or Inf"),
        ({}, _chunks(w=GOOD["w"], b=np.array([1, np.inf, 1], np.float32)), grpc.StatusCode.INVALID_ARGUMENT, "NaN or Inf"),
        (dict(example_count=0), _chunks(**GOOD), grpc.StatusCode.INVALID_ARGUMENT, "example_count"),
        (dict(model_version=7), _chunks(**GOOD), grpc.StatusCode.INVALID_ARGUMENT, "version 7"),
        (dict(learning_rate=float("nan")), _chunks(**GOOD), grpc.StatusCode.INVALID_ARGUMENT, "learning_rate"),
        (dict(learning_rate=-0.5), _chunks(**GOOD), grpc.StatusCode.INVALID_ARGUMENT, "learning_rate"),
    ],
)
def test_bad_pushes_are_refused_and_change_nothing(cluster, header: dict, chunks, code, message: str) -> None:
    client, worker, stub = cluster
    before = client.pull().weights
    fields = dict(worker_id=worker, step=1, model_version=0, example_count=4) | header
    with pytest.raises(grpc.RpcError) as raised:
        _push(stub, pb.PushHeader(**fields), chunks)
    assert raised.value.code() == code
    assert message in raised.value.details()
    after = client.pull()
    assert after.model_version == 0
    for name in before:
        np.testing.assert_array_equal(after.weights[name], before[name])
    # The refused push did not take the worker's step: a good one with it still applies.
    assert client.push(GOOD, step=1, example_count=4).model_version == 1


def test_non_finite_gradients_are_counted(cluster) -> None:
    client, worker, stub = cluster
    with pytest.raises(grpc.RpcError):
        _push(stub, pb.PushHeader(worker_id=worker, step=1, example_count=1), _chunks(w=np.full((2, 3), np.nan, np.float32), b=GOOD["b"]))
    assert client.stats()[0].pushes_rejected_non_finite == 1


def test_truncated_and_overrunning_streams_are_refused(cluster) -> None:
    client, worker, stub = cluster
    header = pb.PushHeader(worker_id=worker, step=1, example_count=1)
    whole = GOOD["w"].tobytes()
    spec = pb.VariableSpec(name="w", dtype="float32", shape=[2, 3])
    for data, message in ((whole[:10], "cut short"), (whole + bytes(4), "holds 24")):
        with pytest.raises(grpc.RpcError) as raised:
            _push(stub, header, [pb.TensorChunk(spec=spec, data=data)] + _chunks(b=GOOD["b"]))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in raised.value.details()
    assert client.pull().model_version == 0


def test_a_push_without_header_or_with_a_stray_message_is_refused(cluster) -> None:
    _, worker, stub = cluster
    with pytest.raises(grpc.RpcError) as raised:
        stub.Push(iter([pb.PushRequest(chunk=_chunks(**GOOD)[0])]), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    header = pb.PushRequest(header=pb.PushHeader(worker_id=worker, step=1, example_count=1))
    with pytest.raises(grpc.RpcError) as raised:
        stub.Push(iter([header, header]), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "only tensor chunks" in raised.value.details()


def test_oversized_messages_are_refused_by_grpc(cluster) -> None:
    _, worker, stub = cluster
    spec = pb.VariableSpec(name="w", dtype="float32", shape=[2, 3])
    huge = pb.TensorChunk(spec=spec, data=bytes(64 << 20))
    with pytest.raises(grpc.RpcError) as raised:
        _push(stub, pb.PushHeader(worker_id=worker, step=1, example_count=1), [huge])
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_bad_hyperparameters_and_groups_are_refused(cluster) -> None:
    client, _, stub = cluster
    with pytest.raises(grpc.RpcError) as raised:
        stub.SetHyperparameters(pb.SetHyperparametersRequest(hyperparameters=pb.Hyperparameters(learning_rate=-1)), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    from_workers = pb.Hyperparameters(learning_rate=float("inf"), learning_rate_from_workers=True)
    with pytest.raises(grpc.RpcError) as raised:
        stub.SetHyperparameters(pb.SetHyperparametersRequest(hyperparameters=from_workers), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as raised:
        stub.SetGroups(pb.SetGroupsRequest(num_groups=2, assignment={12345: 0}), timeout=30)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as raised:
        stub.Register(pb.RegisterRequest(group=5), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert client.describe().hyperparameters.learning_rate == pytest.approx(0.1)


def test_initialising_with_garbage_is_refused(start_server) -> None:
    server = start_server()
    stub = pb_grpc.ParameterServerStub(grpc.insecure_channel(server.address))
    chunk = pb.InitModelRequest(chunk=_chunks(w=np.ones(2, np.float32))[0])
    with pytest.raises(grpc.RpcError) as raised:
        stub.InitModel(iter([chunk]), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    start = pb.InitModelRequest(hyperparameters=pb.Hyperparameters(learning_rate=0.1))
    with pytest.raises(grpc.RpcError) as raised:
        stub.InitModel(iter([start, pb.InitModelRequest(chunk=_chunks(w=np.array([np.nan], np.float32))[0])]), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as raised:
        stub.Pull(pb.PullRequest(newer_than=-1), timeout=30).next()
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_dead_member_does_not_block_its_group(cluster) -> None:
    client, _, _ = cluster
    silent = ParameterServerClient([client.shards[0].address])
    silent_id = silent.register().worker_id
    started = time.monotonic()
    result = client.push(GOOD, step=1, example_count=1)
    assert time.monotonic() - started < 20
    assert result.members_combined == 1
    assert client.stats()[0].workers_dropped == 1
    with pytest.raises(grpc.RpcError) as raised:
        silent.push(GOOD, step=1, example_count=1)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refusal_of(raised.value) == Refusal.DROPPED
    assert silent.register(worker_id=silent_id).worker_id == silent_id


def test_refusals_a_worker_acts_on_carry_their_reason(cluster) -> None:
    client, worker, stub = cluster

    def refusal(header: pb.PushHeader, chunks: list[pb.TensorChunk]) -> int:
        with pytest.raises(grpc.RpcError) as raised:
            _push(stub, header, chunks)
        return refusal_of(raised.value)

    assert refusal(pb.PushHeader(worker_id=999, step=1, example_count=1), _chunks(**GOOD)) == Refusal.NOT_REGISTERED
    nan = _chunks(w=np.full((2, 3), np.nan, np.float32), b=GOOD["b"])
    assert refusal(pb.PushHeader(worker_id=worker, step=1, example_count=1), nan) == Refusal.NON_FINITE
    assert refusal(pb.PushHeader(worker_id=worker, step=1, example_count=0), _chunks(**GOOD)) == Refusal.UNSPECIFIED


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code()


def test_a_worker_id_at_the_int64_limit_is_refused_and_registration_still_works(cluster) -> None:
    client, _, stub = cluster
    assert _code(lambda: stub.Register(pb.RegisterRequest(worker_id=2**63 - 1), timeout=30)) == grpc.StatusCode.INVALID_ARGUMENT
    # Nothing changed: automatic ids, stats and regrouping answer as before.
    assert stub.Register(pb.RegisterRequest(), timeout=30).worker_id == 2
    assert sum(len(g.members) for g in client.stats()[0].groups) == 2
    assert stub.SetGroups(pb.SetGroupsRequest(num_groups=2), timeout=30).num_groups == 2


def test_unbounded_requests_are_refused_with_a_clear_status(cluster) -> None:
    client, worker, stub = cluster
    assert _code(lambda: stub.SetGroups(pb.SetGroupsRequest(num_groups=10**6), timeout=30)) == grpc.StatusCode.INVALID_ARGUMENT
    assert client.describe().num_groups == 1
    for number in range(16):
        client.save_snapshot(f"s{number}")
    with pytest.raises(grpc.RpcError) as raised:
        client.save_snapshot("one too many")
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "16 snapshots at most" in raised.value.details()
    client.save_snapshot("s3")  # a name in use is saved again
    client.delete_snapshot("s3")
    assert _code(lambda: stub.RestoreSnapshot(pb.SnapshotRequest(name="s3"), timeout=30)) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: stub.DeleteSnapshot(pb.SnapshotRequest(name="s3"), timeout=30)) == grpc.StatusCode.NOT_FOUND
    client.save_snapshot("one too many")  # deleting made room
    assert _code(lambda: stub.Pull(pb.PullRequest(wait_for_model_seconds=float("inf")), timeout=30).next()) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: _push(stub, pb.PushHeader(worker_id=worker, step=-1, example_count=1), _chunks(**GOOD))) == grpc.StatusCode.INVALID_ARGUMENT


def test_a_learning_rate_beyond_float32_is_refused_and_the_weights_stay_finite(cluster) -> None:
    client, _, stub = cluster
    request = pb.SetHyperparametersRequest(hyperparameters=pb.Hyperparameters(learning_rate=1e39))
    assert _code(lambda: stub.SetHyperparameters(request, timeout=30)) == grpc.StatusCode.INVALID_ARGUMENT
    client.push(GOOD, step=1, example_count=1)
    assert all(np.isfinite(w).all() for w in client.pull().weights.values())


@pytest.mark.parametrize("exchange", ["push over gRPC", "push_pull through shared memory"])
def test_an_update_that_would_overflow_the_weights_is_refused_and_the_model_kept(cluster, exchange: str) -> None:
    client, worker, stub = cluster
    client.set_hyperparameters(Hyperparameters(8.0))
    overflowing = {"w": np.full((2, 3), -np.finfo(np.float32).max, np.float32), "b": GOOD["b"]}
    send = client.push if exchange.startswith("push over") else client.push_pull
    with pytest.raises(grpc.RpcError) as raised:
        send(overflowing, step=1, example_count=1)
    assert client.shared_memory_shards == ([] if send == client.push else [client.shards[0].address])
    assert refusal_of(raised.value) == Refusal.NON_FINITE
    assert "'w'" in raised.value.details()
    pulled = client.pull()
    assert pulled.model_version == 0
    np.testing.assert_array_equal(pulled.weights["w"], np.ones((2, 3), np.float32))
    assert client.push(GOOD, step=2, example_count=1).model_version == 1
    assert all(np.isfinite(w).all() for w in client.pull().weights.values())


@pytest.mark.parametrize("exchange", ["push over gRPC", "push_pull through shared memory"])
def test_a_gradient_of_a_variable_the_server_does_not_hold_is_refused_by_the_client(cluster, exchange: str) -> None:
    client, _, _ = cluster
    send = client.push if exchange.startswith("push over") else client.push_pull
    with pytest.raises(KeyError, match=r"no variables named \['extra'\]"):
        send({**GOOD, "extra": np.ones(2, np.float32)}, step=1, example_count=1)
    # Nothing went out: the model is as it was, and the next push counts.
    assert client.pull().model_version == 0
    send(GOOD, step=1, example_count=1)
    assert client.pull().model_version == 1


def test_a_huge_declared_shape_is_refused_before_any_memory_is_held(start_server) -> None:
    server = start_server()
    stub = pb_grpc.ParameterServerStub(grpc.insecure_channel(server.address))
    start = pb.InitModelRequest(hyperparameters=pb.Hyperparameters(learning_rate=0.1))
    huge = pb.TensorChunk(spec=pb.VariableSpec(name="w", dtype="float32", shape=[2**40, 2**20]), offset=0, data=b"\0" * 4)
    with pytest.raises(grpc.RpcError) as raised:
        stub.InitModel(iter([start, pb.InitModelRequest(chunk=huge)]), timeout=30)
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_errors_quote_what_the_caller_sent_escaped_and_short(cluster, start_server) -> None:
    _, worker, stub = cluster
    name = "x" * 100_000
    with pytest.raises(grpc.RpcError) as raised:
        _push(stub, pb.PushHeader(worker_id=worker, step=1, example_count=1), _chunks(**{name: np.ones(2, np.float32)}))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(raised.value.details()) < 300
    server = start_server()
    forged = pb_grpc.ParameterServerStub(grpc.insecure_channel(server.address))
    forged.Register(pb.RegisterRequest(host="evil\nINFO forged line"), timeout=30)
    log = server.stop()
    assert "forged line" in log and "\nINFO forged line" not in log


def test_a_history_over_the_limit_is_refused_and_kept_out(cluster) -> None:
    client, _, stub = cluster
    with pytest.raises(grpc.RpcError) as raised:
        stub.RequestStop(pb.RequestStopRequest(history_json="x" * (MAX_HISTORY_CHARS + 1)), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "History" in raised.value.details()
    client.request_stop('{"epoch": [], "history": {}}')
    client.deregister()
    assert client.stats()[0].chief_history == '{"epoch": [], "history": {}}'


def test_weights_set_with_a_wrong_variable_or_nan_are_refused_and_change_nothing(cluster) -> None:
    client, _, stub = cluster
    before = client.pull().weights
    for arrays, code in (
        ({"w": GOOD["w"]}, grpc.StatusCode.INVALID_ARGUMENT),
        ({**GOOD, "w": GOOD["w"].astype(np.float64)}, grpc.StatusCode.INVALID_ARGUMENT),
        ({**GOOD, "w": np.full((2, 3), np.nan, np.float32)}, grpc.StatusCode.INVALID_ARGUMENT),
    ):
        messages = [pb.SetWeightsRequest(chunk=c) for c in _chunks(**arrays)]
        with pytest.raises(grpc.RpcError) as raised:
            stub.SetWeights(iter(messages), timeout=30)
        assert raised.value.code() == code, raised.value.details()
    after = client.pull().weights
    for name, weight in before.items():
        np.testing.assert_array_equal(after[name], weight)
    client.set_weights({name: np.full_like(w, 3.0) for name, w in before.items()})
    for name, weight in client.pull().weights.items():
        np.testing.assert_array_equal(weight, np.full_like(before[name], 3.0))


def test_frozen_weights_with_nan_or_a_bad_dtype_are_refused_and_change_nothing(cluster) -> None:
    client, _, stub = cluster
    client.set_frozen_weights({"frozen": np.ones(3, np.float32)})
    integers = pb.TensorChunk(
        spec=pb.VariableSpec(name="frozen", dtype="int32", shape=[3]), data=np.ones(3, np.int32).tobytes()
    )
    for chunks in (_chunks(frozen=np.full(3, np.nan, np.float32)), [integers]):
        with pytest.raises(grpc.RpcError) as raised:
            stub.SetFrozenWeights(iter([pb.SetFrozenWeightsRequest(chunk=c) for c in chunks]), timeout=30)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    np.testing.assert_array_equal(client.frozen_weights()["frozen"], np.ones(3, np.float32))


def test_a_model_replaced_with_no_header_no_variables_or_nan_is_refused_and_changes_nothing(cluster) -> None:
    client, worker, stub = cluster
    before = client.pull().weights
    header = pb.ReplaceModelRequest(header=pb.ReplaceModelHeader(hyperparameters=Hyperparameters(0.1).to_proto()))
    for messages, message in (
        ([pb.ReplaceModelRequest(chunk=c) for c in _chunks(v=np.ones(2, np.float32))], "header"),
        ([header], "no variables"),
        ([header, *(pb.ReplaceModelRequest(chunk=c) for c in _chunks(v=np.full(2, np.nan, np.float32)))], "NaN"),
    ):
        with pytest.raises(grpc.RpcError) as raised:
            stub.ReplaceModel(iter(messages), timeout=30)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in raised.value.details()
    after = client.pull().weights
    assert after.keys() == before.keys()
    for name, weight in before.items():
        np.testing.assert_array_equal(after[name], weight)

    client.replace_model({"v": np.ones(2, np.float32)}, Hyperparameters(0.5), fresh_optimizer=True)
    assert [spec.name for spec in client.describe().variables] == ["v"]
    _, pulled = client.push_pull({"v": np.ones(2, np.float32)}, step=1, example_count=1)
    np.testing.assert_allclose(pulled.weights["v"], [0.5, 0.5])
    with pytest.raises(KeyError, match="no variables named"):
        client.push_pull(GOOD, step=2, example_count=1)
