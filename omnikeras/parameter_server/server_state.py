"""Everything a restarted server needs to carry on where it stopped."""

from dataclasses import dataclass

import numpy as np

from omnikeras.parameter_server.update_rule import Hyperparameters


@dataclass
class ServerState:
    weights: dict[str, np.ndarray]
    velocities: dict[str, np.ndarray]
    version: int
    # Updates applied, which learning-rate schedules read.
    iterations: int
    hyperparameters: Hyperparameters
    num_groups: int
    # Worker id -> group, so a worker that re-registers returns to its group.
    assignment: dict[int, int]
    # The first batch to hand out.
    next_batch: int = 0
