"""Hundreds of callers waiting at once, and dozens pushing at once, against a real
`omnikeras ps` process over gRPC."""

import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from omnikeras import Hyperparameters, ParameterServerClient
from omnikeras.parameter_server.groups import MAX_WAITING_FOR_MODEL
from omnikeras.v1 import parameter_server_pb2 as pb
from omnikeras.v1 import parameter_server_pb2_grpc as pb_grpc


def _clients(address: str, count: int) -> list[ParameterServerClient]:
    # Over gRPC: shared memory would serve them on threads of its own.
    return [ParameterServerClient([address], shared_memory=False) for _ in range(count)]


def _in_threads(calls: list[Callable[[], object]]) -> list[object]:
    with futures.ThreadPoolExecutor(len(calls)) as pool:
        return [f.result(timeout=120) for f in [pool.submit(call) for call in calls]]


def _until(condition: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_256_members_wait_in_one_group_while_the_server_answers_everyone_else(start_server) -> None:
    server = start_server("--group-timeout", "120")
    clients = _clients(server.address, 256)
    ids = [r.worker_id for r in _in_threads([c.register for c in clients])]
    clients[0].init_model({"w": np.zeros(4, np.float32)}, Hyperparameters(1.0))
    observer = ParameterServerClient([server.address], shared_memory=False)

    def push(index: int) -> pb.PushReply:
        clients[index].pull()
        return clients[index].push({"w": np.full(4, ids[index], np.float32)}, step=1, example_count=1)

    with futures.ThreadPoolExecutor(256) as pool:
        waiting = [pool.submit(push, i) for i in range(255)]
        _until(lambda: observer.stats()[0].pushes_received == 255)
        # 255 members hold their calls open; every other call is still answered.
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(server.address))
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
        assert observer.pull().model_version == 0
        assert not any(f.done() for f in waiting)
        last = push(255)
        results = [f.result(timeout=60) for f in waiting] + [last]
    assert {(r.model_version, r.members_combined) for r in results} == {(1, 256)}
    np.testing.assert_array_equal(observer.pull().weights["w"], np.full(4, -np.mean(ids), np.float32))


def test_pulls_waiting_for_the_model_end_with_their_callers(start_server) -> None:
    server = start_server()
    stub = pb_grpc.ParameterServerStub(grpc.insecure_channel(server.address))

    def wait_and_give_up() -> grpc.StatusCode:
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.Pull(pb.PullRequest(wait_for_model_seconds=600), timeout=1))
        return raised.value.code()

    # Together more than the server lets wait at once: the first round's calls must have
    # stopped waiting when their callers gave up.
    rounds = 2
    for _ in range(rounds):
        codes = _in_threads([wait_and_give_up] * (MAX_WAITING_FOR_MODEL // rounds + 50))
        assert set(codes) == {grpc.StatusCode.DEADLINE_EXCEEDED}
        time.sleep(1.5)
    client = ParameterServerClient([server.address], shared_memory=False)
    client.register()
    waiting = futures.ThreadPoolExecutor(1).submit(
        ParameterServerClient([server.address], shared_memory=False).pull, wait_for_model=60
    )
    assert client.init_model({"w": np.ones(2, np.float32)}, Hyperparameters(0.1))
    np.testing.assert_array_equal(waiting.result(timeout=30).weights["w"], np.ones(2, np.float32))


def test_64_clients_pushing_at_once_in_8_groups_reach_the_exact_weights(start_server) -> None:
    server = start_server("--groups", "8")
    clients = _clients(server.address, 64)
    registrations = [c.register() for c in clients]
    clients[0].init_model({"w": np.zeros(3, np.float32)}, Hyperparameters(1.0, compensate_asynchrony=False))
    steps = 10
    barrier = threading.Barrier(64)

    def train(index: int) -> None:
        client, value = clients[index], registrations[index].worker_id
        barrier.wait(timeout=60)
        for step in range(1, steps + 1):
            client.pull()
            client.push({"w": np.full(3, value, np.float32)}, step=step, example_count=1)

    _in_threads([lambda i=i: train(i) for i in range(64)])
    groups: dict[int, list[int]] = {}
    for registration in registrations:
        groups.setdefault(registration.group, []).append(registration.worker_id)
    assert sorted(len(members) for members in groups.values()) == [8] * 8
    # Every group step applies its members' mean gradient once, at a learning rate of 1.
    expected = -steps * sum(np.mean(members) for members in groups.values())
    stats = clients[0].stats()[0]
    assert stats.updates_applied == 8 * steps
    np.testing.assert_array_equal(clients[0].pull().weights["w"], np.full(3, expected, np.float32))
