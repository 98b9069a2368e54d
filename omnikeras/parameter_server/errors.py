"""The errors that the parameter server turns into gRPC statuses."""

import grpc


class ParameterServerError(Exception):
    """A request the server refuses; `code` is the gRPC status the caller receives."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(ParameterServerError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ParameterServerError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ParameterServerError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(ParameterServerError):
    code = grpc.StatusCode.ABORTED


class NonFinite(InvalidArgument):
    """A tensor holds NaN or Inf values."""

    def __init__(self, what: str, name: str) -> None:
        super().__init__(f"{what} {name!r} holds NaN or Inf values; rejected")
