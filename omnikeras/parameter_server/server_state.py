"""Everything a restarted server needs to carry on where it stopped."""

from dataclasses import dataclass, field

import numpy as np

from omnikeras.parameter_server.update_rule import Hyperparameters

# Weights and momentum buffers, by variable name.
Arrays = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]


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
    # The snapshots saved by name (a tuner's), so that a restarted server can restore them.
    snapshots: dict[str, Arrays] = field(default_factory=dict)
