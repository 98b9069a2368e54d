"""The parameter server of grouped asynchronous SGD, and its client."""

from omnikeras.parameter_server.client import ParameterServerClient
from omnikeras.parameter_server.errors import Refusal
from omnikeras.parameter_server.server import ParameterServer
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.parameter_server.values import (
    Description,
    GroupLayout,
    GroupStats,
    PullResult,
    PushResult,
    Registration,
    Stats,
)

__all__ = [
    "Description",
    "GroupLayout",
    "GroupStats",
    "Hyperparameters",
    "ParameterServer",
    "ParameterServerClient",
    "PullResult",
    "PushResult",
    "Refusal",
    "Registration",
    "Stats",
]
