"""One connection to one parameter-server process, with deadlines and retries."""

import random
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from omnikeras.parameter_server import auth, tensors
from omnikeras.v1 import parameter_server_pb2 as pb
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
        self.tensor_stub = TensorStreamStub(channel)
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


class TensorStreamStub:
    """The calls that stream tensors, as in the generated stub, except that requests may be
    messages serialized beforehand (see `tensors.encode_messages`) and replies come as
    `tensors.Received`."""

    def __init__(self, channel: grpc.Channel) -> None:
        service = "/" + pb.DESCRIPTOR.services_by_name["ParameterServer"].full_name
        self.InitModel = channel.stream_unary(
            f"{service}/InitModel",
            request_serializer=tensors.serialize,
            response_deserializer=pb.InitModelReply.FromString,
        )
        self.SetWeights = channel.stream_unary(
            f"{service}/SetWeights",
            request_serializer=tensors.serialize,
            response_deserializer=pb.SetWeightsReply.FromString,
        )
        self.ReplaceModel = channel.stream_unary(
            f"{service}/ReplaceModel",
            request_serializer=tensors.serialize,
            response_deserializer=pb.ReplaceModelReply.FromString,
        )
        self.SetFrozenWeights = channel.stream_unary(
            f"{service}/SetFrozenWeights",
            request_serializer=tensors.serialize,
            response_deserializer=pb.SetFrozenWeightsReply.FromString,
        )
        self.GetFrozenWeights = channel.unary_stream(
            f"{service}/GetFrozenWeights",
            request_serializer=pb.GetFrozenWeightsRequest.SerializeToString,
            response_deserializer=tensors.decoder(pb.GetFrozenWeightsReply),
        )
        self.Push = channel.stream_unary(
            f"{service}/Push",
            request_serializer=tensors.serialize,
            response_deserializer=pb.PushReply.FromString,
        )
        self.Pull = channel.unary_stream(
            f"{service}/Pull",
            request_serializer=pb.PullRequest.SerializeToString,
            response_deserializer=tensors.decoder(pb.PullReply),
        )
        self.PushPull = channel.stream_stream(
            f"{service}/PushPull",
            request_serializer=tensors.serialize,
            response_deserializer=tensors.decoder(pb.PullReply),
        )
