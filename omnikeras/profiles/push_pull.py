"""The parameter server's push_pull time for a model of a given size, on this machine."""

import os
import statistics
import time
from collections.abc import Sequence

import numpy as np

from omnikeras.parameter_server import Hyperparameters, ParameterServerClient
from omnikeras.processes import start_parameter_server


def measure_push_pull(parameters: Sequence[tuple[Sequence[int], str]], repeats: int = 20) -> float:
    """Median seconds of one push_pull of gradients shaped like `parameters` through a real
    `omnikeras ps` process started here, with one worker in one group.

    The server runs in a process of its own, as in a local cluster, so the time includes
    serialisation on both sides, the loopback network and the server's update.

    Args:
        parameters: `(shape, dtype)` of each trainable variable.
        repeats: Timed push_pulls, after two untimed ones. Defaults to 20.

    Example:

    >>> measure_push_pull([((3, 3, 1, 32), "float32"), ((32,), "float32")])
    0.0012
    """
    weights = {f"v{index}": np.zeros(shape, dtype) for index, (shape, dtype) in enumerate(parameters)}
    with open(os.devnull, "w") as log:
        server, address = start_parameter_server(["--groups", "1"], log, name="profiling parameter server")
    try:
        with ParameterServerClient([address]) as client:
            client.register()
            client.init_model(weights, Hyperparameters(learning_rate=0.01))
            gradients = {name: np.ones_like(w) for name, w in weights.items()}
            times = []
            for step in range(1, repeats + 3):
                start = time.perf_counter()
                client.push_pull(gradients, step=step, example_count=1)
                times.append(time.perf_counter() - start)
        return statistics.median(times[2:])
    finally:
        server.terminate()
