"""Everything a restarted server needs to carry on where it stopped."""

from dataclasses import dataclass, field

import numpy as np

from omnikeras.parameter_server.optimizers.base import Slots
from omnikeras.parameter_server.update_rule import Hyperparameters

# The optimizer's state, by variable name.
OptimizerState = dict[str, Slots]
# Weights by variable name, and the optimizer's state.
Arrays = tuple[dict[str, np.ndarray], OptimizerState]


@dataclass
class ServerState:
    weights: dict[str, np.ndarray]
    slots: OptimizerState
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
    # The model's frozen weights (see `GroupCoordinator.set_frozen_weights`).
    frozen_weights: dict[str, np.ndarray] = field(default_factory=dict)
