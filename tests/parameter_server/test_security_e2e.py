"""Shared token, TLS and the standard health service, against real server processes."""

import socket
import subprocess
import sys

import grpc
import numpy as np
import pytest
from certificates import self_signed
from grpc_health.v1 import health_pb2, health_pb2_grpc

from omnikeras import Hyperparameters, ParameterServerClient
from omnikeras.parameter_server import auth


def _health(channel: grpc.Channel, service: str = "omnikeras.v1.ParameterServer", token: str | None = None) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service=service)
    return stub.Check(request, timeout=10, metadata=auth.token_metadata(token)).status


def test_calls_need_the_right_token(start_server) -> None:
    server = start_server("--token", "s3cret")
    for token in (None, "wrong"):
        client = ParameterServerClient([server.address], token=token)
        with pytest.raises(grpc.RpcError) as raised:
            client.register()
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    client = ParameterServerClient([server.address], token="s3cret")
    client.register()
    client.init_model({"w": np.zeros(2, np.float32)}, Hyperparameters(0.1))
    assert client.push({"w": np.ones(2, np.float32)}, step=1, example_count=1).model_version == 1
    assert _health(grpc.insecure_channel(server.address), token="s3cret") == health_pb2.HealthCheckResponse.SERVING


def test_health_checks_need_the_token_except_on_a_health_port_of_their_own(start_server) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        health_port = probe.getsockname()[1]
    server = start_server("--token", "s3cret", "--health-port", str(health_port))
    with pytest.raises(grpc.RpcError) as raised:
        _health(grpc.insecure_channel(server.address))
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _health(grpc.insecure_channel(f"127.0.0.1:{health_port}")) == health_pb2.HealthCheckResponse.SERVING
    # The health port serves nothing else.
    with pytest.raises(grpc.RpcError) as raised:
        ParameterServerClient([f"127.0.0.1:{health_port}"], token="s3cret").register()
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_undecodable_calls_without_the_token_cost_the_server_no_memory(start_server) -> None:
    server = start_server("--token", "s3cret")
    channel = grpc.insecure_channel(server.address)
    garbage = channel.unary_unary("/grpc.health.v1.Health/Check")

    def send(count: int) -> None:
        for _ in range(count):
            with pytest.raises(grpc.RpcError):
                garbage(b"\xff" * 64, timeout=10)

    send(500)
    before = server.rss_mib()
    send(5000)
    # Decoded, such calls cost grpcio about 19 KiB each that it never returns (90 MiB here).
    assert server.rss_mib() - before < 20


def test_the_token_can_come_from_the_environment(start_server, monkeypatch) -> None:
    monkeypatch.setenv("OMNIKERAS_TOKEN", "from-env")
    server = start_server()
    with pytest.raises(grpc.RpcError) as raised:
        ParameterServerClient([server.address]).register()
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    ParameterServerClient([server.address], token="from-env").register()


@pytest.fixture
def certificate(tmp_path):
    return self_signed(tmp_path)


def test_tls_with_a_token(start_server, certificate) -> None:
    cert, key = certificate
    server = start_server("--tls-cert", cert, "--tls-key", key, "--token", "t")
    client = ParameterServerClient([server.address], token="t", root_cert=cert)
    assert client.register().worker_id == 1
    plain = ParameterServerClient([server.address], token="t", retry_seconds=0.5)
    with pytest.raises(grpc.RpcError) as raised:
        plain.register()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_command_refuses_half_a_tls_setup(certificate) -> None:
    cert, _ = certificate
    result = subprocess.run(
        [sys.executable, "-m", "omnikeras", "ps", "--port", "0", "--tls-cert", cert],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "both a certificate and a key" in result.stderr
