"""omnikeras: the Omnivore optimizer for Keras and TensorFlow.

Grouped asynchronous SGD through a gRPC parameter server, for Keras models trained on a
mix of CPUs and GPUs.

Example:

>>> import omnikeras
>>> server = omnikeras.ParameterServer(num_groups=2)
>>> port = server.start()
>>> client = omnikeras.ParameterServerClient([server.address])
>>> worker = client.register()
>>> server.stop()
"""

from omnikeras.parameter_server import (
    Hyperparameters,
    ParameterServer,
    ParameterServerClient,
    PullResult,
    PushResult,
    Registration,
)

__version__ = "0.1.0"

__all__ = [
    "Hyperparameters",
    "ParameterServer",
    "ParameterServerClient",
    "PullResult",
    "PushResult",
    "Registration",
]
