"""One connection to one parameter-server process, with deadlines and retries."""

import random
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from omnikeras.parameter_server import auth
from omnikeras.v1 import parameter_server_pb2_grpc as pb_grpc

_T = TypeVar("_T")

_RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE})


class ShardConnection:
    """A channel to one server, whose calls retry UNAVAILABLE with exponential backoff.

    Retrying a push is safe: the server recognises a step it already took.
    """

    def __init__(
        self,
        address: str,
        token: str | None = None,
        root_cert: str | None = None,
        retry_seconds: float = 30.0,
    ) -> None:
        self.address = address
        if root_cert:
            channel = grpc.secure_channel(address, auth.channel_credentials(root_cert))
        else:
            channel = grpc.insecure_channel(address)
        self.channel = channel
        self.stub = pb_grpc.ParameterServerStub(channel)
        self.metadata = auth.token_metadata(token)
        self.retry_seconds = retry_seconds

    def call(self, attempt: Callable[[], _T]) -> _T:
        """Runs `attempt` (one whole RPC) until it succeeds, fails for good, or the retry
        budget is spent."""
        give_up_at = time.monotonic() + self.retry_seconds
        backoff = 0.05
        while True:
            try:
                return attempt()
            except grpc.RpcError as error:
                if error.code() not in _RETRIED or time.monotonic() + backoff > give_up_at:
                    raise
            time.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, 2.0)

    def close(self) -> None:
        self.channel.close()
