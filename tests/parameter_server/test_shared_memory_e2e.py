"""push_pull through shared memory with a real server process on this host."""

import os
import pathlib
import threading
import time

import grpc
import numpy as np
import pytest

from omnikeras import Hyperparameters, ParameterServer, ParameterServerClient
from omnikeras.parameter_server.errors import Refusal, refusal_of
from omnikeras.parameter_server.shared_memory import StatusError
from omnikeras.parameter_server.shared_memory_client import SharedMemoryChannel
from omnikeras.parameter_server.shared_memory_server import STALE_AFTER_SECONDS

WEIGHTS = {"kernel": np.linspace(-1, 1, 600, dtype=np.float32).reshape(20, 30), "bias": np.zeros(30, np.float32)}
HYPERPARAMETERS = Hyperparameters(0.05, momentum=0.9, settings={"nesterov": 1.0})


def _gradients(worker: int, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 * worker + step)
    return {name: rng.normal(size=w.shape).astype(np.float32) for name, w in WEIGHTS.items()}


def _train(
    address: str, shared_memory: bool, workers: int, steps: int, rule: Hyperparameters = HYPERPARAMETERS
) -> tuple[dict[str, np.ndarray], list[list[str]]]:
    """`workers` clients in one group push_pull known gradients in lock step; returns the
    final weights and the shards each client reached through shared memory."""
    clients = [ParameterServerClient([address], shared_memory=shared_memory) for _ in range(workers)]
    ids = [client.register().worker_id for client in clients]
    clients[0].init_model(WEIGHTS, rule)
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for step in range(1, steps + 1):
                _, pulled = clients[index].push_pull(_gradients(ids[index], step), step=step, example_count=8 * (index + 1))
                assert pulled.model_version >= step
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return clients[0].pull().weights, [client.shared_memory_shards for client in clients]


@pytest.mark.parametrize(
    "rule",
    # Adam with a statistic between the trained variables: the update over the servers'
    # buffers leaves it out, on both paths.
    [HYPERPARAMETERS, Hyperparameters(0.01, momentum=0.9, optimizer="Adam", statistics=frozenset({"bias"}))],
    ids=["sgd", "adam with a statistic"],
)
def test_shared_memory_and_grpc_reach_bit_identical_weights(start_server, rule: Hyperparameters) -> None:
    through_memory = start_server()
    weights, shards = _train(through_memory.address, shared_memory=True, workers=2, steps=30, rule=rule)
    assert shards == [[through_memory.address]] * 2
    through_grpc = start_server()
    expected, shards = _train(through_grpc.address, shared_memory=False, workers=2, steps=30, rule=rule)
    assert shards == [[], []]
    for name in WEIGHTS:
        np.testing.assert_array_equal(weights[name], expected[name])
    assert not np.array_equal(weights["kernel"], WEIGHTS["kernel"])


def test_members_on_either_path_share_one_group_step(start_server) -> None:
    server = start_server()
    memory, rpc = ParameterServerClient([server.address]), ParameterServerClient([server.address], shared_memory=False)
    memory_id, rpc_id = memory.register().worker_id, rpc.register().worker_id
    memory.init_model(WEIGHTS, Hyperparameters(1.0))
    results = {}
    # Multiples of 4 keep the weighted mean exact in float32.
    pushes = {memory_id: (memory, 4.0, 1), rpc_id: (rpc, 8.0, 3)}

    def push(worker: int) -> None:
        client, value, count = pushes[worker]
        results[worker] = client.push_pull({n: np.full(w.shape, value, np.float32) for n, w in WEIGHTS.items()}, 1, count)

    threads = [threading.Thread(target=push, args=(w,)) for w in pushes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert memory.shared_memory_shards == [server.address] and rpc.shared_memory_shards == []
    (memory_push, memory_pull), (rpc_push, rpc_pull) = results[memory_id], results[rpc_id]
    assert memory_push.members_combined == rpc_push.members_combined == 2
    expected = WEIGHTS["kernel"] - (4.0 * 1 + 8.0 * 3) / 4
    np.testing.assert_array_equal(memory_pull.weights["kernel"], expected)
    np.testing.assert_array_equal(rpc_pull.weights["kernel"], expected)


@pytest.mark.parametrize(
    ("gradients", "code", "message"),
    [
        ({"kernel": np.full((20, 30), np.nan, np.float32), "bias": np.ones(30, np.float32)}, grpc.StatusCode.INVALID_ARGUMENT, "gradient 'kernel' holds NaN or Inf"),
        ({"kernel": np.ones((20, 30), np.float32), "bias": np.full(30, np.inf, np.float32)}, grpc.StatusCode.INVALID_ARGUMENT, "gradient 'bias' holds NaN or Inf"),
        ({"kernel": np.ones((30, 20), np.float32), "bias": np.ones(30, np.float32)}, grpc.StatusCode.INVALID_ARGUMENT, "expected float32[20, 30]"),
        ({"kernel": np.ones((20, 30), np.float64), "bias": np.ones(30, np.float32)}, grpc.StatusCode.INVALID_ARGUMENT, "got float64"),
        ({"kernel": np.ones((20, 30), np.float32)}, grpc.StatusCode.INVALID_ARGUMENT, "missing ['bias']"),
    ],
)
def test_bad_gradients_are_refused_and_change_nothing(start_server, gradients, code, message) -> None:
    server = start_server()
    client = ParameterServerClient([server.address])
    client.register()
    client.init_model(WEIGHTS, HYPERPARAMETERS)
    with pytest.raises(grpc.RpcError) as raised:
        client.push_pull(gradients, step=1, example_count=8)
    assert client.shared_memory_shards == [server.address]
    assert raised.value.code() == code
    assert message in raised.value.details()
    assert refusal_of(raised.value) == (Refusal.NON_FINITE if "NaN" in message else Refusal.UNSPECIFIED)
    pulled = client.pull()
    assert pulled.model_version == 0
    np.testing.assert_array_equal(pulled.weights["kernel"], WEIGHTS["kernel"])
    # The step was not taken: a good push with it applies, still through shared memory.
    push, _ = client.push_pull(_gradients(1, 1), step=1, example_count=8)
    assert push.model_version == 1
    assert client.shared_memory_shards == [server.address]


def test_a_restore_aborts_gradients_of_the_weights_before_it(start_server) -> None:
    server = start_server()
    client = ParameterServerClient([server.address])
    client.register()
    client.init_model(WEIGHTS, HYPERPARAMETERS)
    client.save_snapshot("start")
    client.push_pull(_gradients(1, 1), step=1, example_count=8)
    client.restore_snapshot("start")
    with pytest.raises(grpc.RpcError) as raised:
        client.push_pull(_gradients(1, 2), step=2, example_count=8)
    assert isinstance(raised.value, StatusError)
    assert raised.value.code() == grpc.StatusCode.ABORTED
    client.pull()
    push, pulled = client.push_pull(_gradients(1, 3), step=3, example_count=8)
    assert push.model_version == 3


def test_a_hello_without_the_token_is_refused(start_server) -> None:
    server = start_server("--token", "secret")
    client = ParameterServerClient([server.address], token="secret")
    worker = client.register().worker_id
    client.init_model(WEIGHTS, HYPERPARAMETERS)
    client.push_pull(_gradients(worker, 1), step=1, example_count=8)
    assert client.shared_memory_shards == [server.address]
    described = client.describe()
    specs = {v.name: v for v in described.variables}
    with pytest.raises(StatusError) as raised:
        SharedMemoryChannel(described.shared_memory_socket, described.server_id, worker, specs, "wrong", 10)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    wrong_layout = {"kernel": specs["kernel"]}
    with pytest.raises(StatusError, match="layout differs"):
        SharedMemoryChannel(described.shared_memory_socket, described.server_id, worker, wrong_layout, "secret", 10)


def test_training_goes_on_through_a_server_restart(start_server, tmp_path) -> None:
    server = start_server("--checkpoint-dir", str(tmp_path))
    client = ParameterServerClient([server.address])
    client.register()
    client.init_model(WEIGHTS, HYPERPARAMETERS)
    for step in range(1, 4):
        client.push_pull(_gradients(1, step), step=step, example_count=8)
    client.checkpoint()
    socket_path = client.describe().shared_memory_socket
    server.kill()
    port = server.address.rpartition(":")[2]
    restarted = start_server("--checkpoint-dir", str(tmp_path), "--port", port)
    client.register(worker_id=client.worker_id)
    push, _ = client.push_pull(_gradients(1, 4), step=4, example_count=8)
    assert push.model_version == 4
    assert client.shared_memory_shards == [restarted.address]
    assert client.describe().shared_memory_socket != socket_path


def test_a_closed_exchange_loses_no_step() -> None:
    server = ParameterServer()
    server.start()
    try:
        client = ParameterServerClient([server.address])
        client.register()
        client.init_model(WEIGHTS, Hyperparameters(0.5))
        client.push_pull(_gradients(1, 1), step=1, example_count=8)
        assert client.shared_memory_shards == [server.address]
        server._shared_memory.close()
        # The push finds the exchange closed and goes over gRPC; the next ones stay there.
        for step in (2, 3):
            push, pulled = client.push_pull(_gradients(1, step), step=step, example_count=8)
            assert push.model_version == step
        assert client.shared_memory_shards == []
        expected = WEIGHTS["kernel"] - sum(0.5 * _gradients(1, step)["kernel"] for step in (1, 2, 3))
        np.testing.assert_allclose(pulled.weights["kernel"], expected, atol=1e-6)
    finally:
        server.stop()


def test_a_stopped_server_leaves_no_socket_behind(start_server) -> None:
    server = start_server()
    client = ParameterServerClient([server.address])
    client.register()
    client.init_model(WEIGHTS, HYPERPARAMETERS)
    client.push_pull(_gradients(1, 1), step=1, example_count=8)
    directory = os.path.dirname(client.describe().shared_memory_socket)
    assert os.path.exists(directory)
    server.stop()
    assert not os.path.exists(directory)


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shared-memory", "grpc"])
def test_the_caller_s_work_runs_once_while_its_push_is_out(start_server, shared_memory: bool) -> None:
    # A group of two: the other member's push completes the group step only where this
    # member's push reached the server before `while_waiting` ran.
    server = start_server("--group-timeout", "10")
    first, second = (ParameterServerClient([server.address], shared_memory=shared_memory) for _ in range(2))
    first.register(), second.register()
    first.init_model(WEIGHTS, Hyperparameters(1.0))
    gradients = {n: np.full(w.shape, 2.0, np.float32) for n, w in WEIGHTS.items()}
    completed = []

    def other_member_pushes() -> None:
        completed.append(second.push_pull(gradients, step=1, example_count=1))

    push, pulled = first.push_pull(gradients, step=1, example_count=1, while_waiting=other_member_pushes)
    assert len(completed) == 1
    assert push.members_combined == 2 and completed[0][0].members_combined == 2
    np.testing.assert_array_equal(pulled.weights["bias"], WEIGHTS["bias"] - 2.0)
    assert first.shared_memory_shards == ([server.address] if shared_memory else [])


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shared-memory", "grpc"])
def test_a_failure_of_the_caller_s_work_leaves_the_exchange_in_step(start_server, shared_memory: bool) -> None:
    server = start_server()
    client = ParameterServerClient([server.address], shared_memory=shared_memory)
    client.register()
    client.init_model(WEIGHTS, Hyperparameters(1.0))
    ones = {n: np.ones(w.shape, np.float32) for n, w in WEIGHTS.items()}

    def fails() -> None:
        raise RuntimeError("the caller's own work failed")

    with pytest.raises(RuntimeError, match="own work failed"):
        client.push_pull(ones, step=1, example_count=1, while_waiting=fails)
    # The failed call's push was applied; the next exchange reads its own reply.
    push, pulled = client.push_pull(ones, step=2, example_count=1)
    assert pulled.model_version == 2 and push.iterations == 2
    np.testing.assert_array_equal(pulled.weights["bias"], WEIGHTS["bias"] - 2.0)


def test_the_caller_s_work_runs_once_across_shards(start_server) -> None:
    addresses = [start_server().address, start_server().address]
    client = ParameterServerClient(addresses)
    client.register()
    client.init_model(WEIGHTS, Hyperparameters(1.0))
    calls = []
    _, pulled = client.push_pull(
        {n: np.ones(w.shape, np.float32) for n, w in WEIGHTS.items()}, step=1, example_count=1,
        while_waiting=lambda: calls.append(1),
    )
    assert calls == [1]
    assert set(pulled.weights) == set(WEIGHTS) and pulled.model_version == 1


def test_a_killed_server_s_socket_directory_goes_with_the_next_server(start_server) -> None:
    killed = start_server()
    directory = pathlib.Path(ParameterServerClient([killed.address]).describe().shared_memory_socket).parent
    killed.kill()
    killed.process.wait(30)
    assert directory.exists(), "a killed server cannot remove its directory"
    # Older than a server that may not listen yet.
    os.utime(directory, (time.time() - 2 * STALE_AFTER_SECONDS,) * 2)
    started = start_server()
    assert not directory.exists()
    assert pathlib.Path(ParameterServerClient([started.address]).describe().shared_memory_socket).exists()
