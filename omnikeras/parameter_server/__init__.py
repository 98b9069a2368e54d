"""The parameter server of grouped asynchronous SGD, and its client."""

from omnikeras.parameter_server.client import ParameterServerClient, PullResult, Registration
from omnikeras.parameter_server.groups import PushResult
from omnikeras.parameter_server.server import ParameterServer
from omnikeras.parameter_server.update_rule import Hyperparameters

__all__ = [
    "Hyperparameters",
    "ParameterServer",
    "ParameterServerClient",
    "PullResult",
    "PushResult",
    "Registration",
]
