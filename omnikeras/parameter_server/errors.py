"""The errors that the parameter server turns into gRPC statuses, and the reason a caller
reads back from one (`refusal_of`)."""

import grpc

from omnikeras.v1 import parameter_server_pb2 as pb

# The trailing metadata that carries a `pb.Refusal` over gRPC.
REFUSAL_KEY = "omnikeras-refusal"


class ParameterServerError(Exception):
    """A request the server refuses; `code` is the gRPC status the caller receives, and
    `refusal` the reason it can act on, when there is one."""

    code = grpc.StatusCode.INTERNAL
    refusal: "pb.Refusal" = pb.REFUSAL_UNSPECIFIED


class InvalidArgument(ParameterServerError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ParameterServerError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ParameterServerError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(ParameterServerError):
    code = grpc.StatusCode.ABORTED


class ResourceExhausted(ParameterServerError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class NotRegistered(NotFound):
    refusal = pb.NOT_REGISTERED


class Dropped(FailedPrecondition):
    refusal = pb.DROPPED


class NonFinite(InvalidArgument):
    """A tensor holds NaN or Inf values."""

    refusal = pb.NON_FINITE

    def __init__(self, what: str, name: str) -> None:
        super().__init__(f"{what} {shown(name)} holds NaN or Inf values; rejected")


def shown(name: str) -> str:
    """A name a caller sent, as an error message or a log line quotes it: escaped, and
    cut short, so that it neither forges lines nor swells the message."""
    return repr(name if len(name) <= 80 else name[:80] + "...")


def refusal_of(error: grpc.RpcError) -> "pb.Refusal":
    """The reason the server gave for refusing a call, from the error the caller got."""
    given = getattr(error, "refusal", None)
    if given is not None:
        return given
    trailing = error.trailing_metadata() if isinstance(error, grpc.Call) else None
    for key, value in trailing or ():
        if key == REFUSAL_KEY and value.isdigit() and int(value) in pb.Refusal.values():
            return pb.Refusal.Value(pb.Refusal.Name(int(value)))
    return pb.REFUSAL_UNSPECIFIED
