"""The errors that the parameter server turns into gRPC statuses, and the reason a caller
reads back from one (`refusal_of`)."""

import enum

import grpc

from omnikeras.v1 import parameter_server_pb2 as pb

# The trailing metadata that carries a `pb.Refusal` over gRPC.
REFUSAL_KEY = "omnikeras-refusal"


class Refusal(enum.IntEnum):
    """Why the server refused a call, where the caller can act on it (`pb.Refusal`)."""

    UNSPECIFIED = pb.REFUSAL_UNSPECIFIED
    # Register (again): the server does not know the worker.
    NOT_REGISTERED = pb.NOT_REGISTERED
    # Register again: the worker missed its group's deadline.
    DROPPED = pb.DROPPED
    # Carry on from the newest weights: the gradient, or the update it made, held NaN or Inf.
    NON_FINITE = pb.NON_FINITE

    @classmethod
    def of(cls, value: int) -> "Refusal":
        """The refusal numbered `value`; UNSPECIFIED for one this client does not know."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNSPECIFIED


class ParameterServerError(Exception):
    """A request the server refuses; `code` is the gRPC status the caller receives, and
    `refusal` the reason it can act on, when there is one."""

    code = grpc.StatusCode.INTERNAL
    refusal = Refusal.UNSPECIFIED


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
    refusal = Refusal.NOT_REGISTERED


class Dropped(FailedPrecondition):
    refusal = Refusal.DROPPED


class NonFinite(InvalidArgument):
    """A tensor holds NaN or Inf values."""

    refusal = Refusal.NON_FINITE

    def __init__(self, what: str, name: str) -> None:
        super().__init__(f"{what} {shown(name)} holds NaN or Inf values; rejected")


def shown(name: str) -> str:
    """A name a caller sent, as an error message or a log line quotes it: escaped, and
    cut short, so that it neither forges lines nor swells the message."""
    return repr(name if len(name) <= 80 else name[:80] + "...")


def refusal_of(error: grpc.RpcError) -> Refusal:
    """The reason the server gave for refusing a call, from the error the caller got."""
    given = getattr(error, "refusal", None)
    if given is not None:
        return Refusal.of(given)
    trailing = error.trailing_metadata() if isinstance(error, grpc.Call) else None
    for key, value in trailing or ():
        if key == REFUSAL_KEY and value.isdigit():
            return Refusal.of(int(value))
    return Refusal.UNSPECIFIED
