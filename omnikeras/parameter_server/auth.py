"""Optional shared-token authentication and TLS for the parameter server.

The token travels in the `authorization` call metadata as `Bearer <token>`, and every
call needs it, health checks included: a caller without it reaches no message decoder
(grpcio keeps memory for calls it cannot decode). Orchestrators that cannot send it probe
a health port of the server's own (`ParameterServer(health_port=...)`).
"""

import hmac
from collections.abc import Callable

import grpc

TOKEN_METADATA_KEY = "authorization"


class TokenInterceptor(grpc.ServerInterceptor):
    """Rejects every call without the right token with UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        presented = str(metadata.get(TOKEN_METADATA_KEY, "")).encode()
        if hmac.compare_digest(presented, self._expected):
            return handler
        return _refusal(handler, "missing or wrong token" if presented else "missing token")


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    def abort(request: object, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    # The refusal must have the method's own streaming shape, or gRPC misreads the call.
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return ((TOKEN_METADATA_KEY, f"Bearer {token}"),) if token else ()


def server_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials:
    with open(key_file, "rb") as key, open(cert_file, "rb") as cert:
        return grpc.ssl_server_credentials([(key.read(), cert.read())])


def channel_credentials(root_cert_file: str) -> grpc.ChannelCredentials:
    with open(root_cert_file, "rb") as cert:
        return grpc.ssl_channel_credentials(root_certificates=cert.read())
