"""The weights the server holds, their momentum buffers, version and update rule.

Not thread-safe on its own: `GroupCoordinator` calls it under its lock.
"""

import time
from collections.abc import Mapping

import numpy as np

from omnikeras.parameter_server import tensors
from omnikeras.parameter_server.errors import FailedPrecondition
from omnikeras.parameter_server.update_rule import Hyperparameters, apply_update
from omnikeras.v1 import parameter_server_pb2 as pb


class ModelState:
    def __init__(self, hyperparameters: Hyperparameters) -> None:
        self.hyperparameters = hyperparameters
        self.weights: dict[str, np.ndarray] = {}
        self.velocities: dict[str, np.ndarray] = {}
        self.specs: dict[str, tensors.VariableSpec] = {}
        self.version = 0
        self.apply_seconds_total = 0.0
        self._pull_cache: tuple[int, list[bytes]] | None = None

    @property
    def initialized(self) -> bool:
        return bool(self.specs)

    @property
    def parameter_count(self) -> int:
        return sum(int(w.size) for w in self.weights.values())

    @property
    def parameter_bytes(self) -> int:
        return sum(int(w.nbytes) for w in self.weights.values())

    def initialize(
        self,
        weights: Mapping[str, np.ndarray],
        version: int = 0,
        velocities: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.weights = {name: tensors.little_endian(w) for name, w in weights.items()}
        self.specs = {name: tensors.VariableSpec.of(name, w) for name, w in self.weights.items()}
        self.velocities = dict(velocities or {})
        self.version = version
        self._pull_cache = None

    def require_initialized(self) -> None:
        if not self.initialized:
            raise FailedPrecondition("the model is not initialised yet: call InitModel first")

    def apply(self, gradients: Mapping[str, np.ndarray]) -> None:
        """Applies one update; the gradient arrays are consumed as scratch space."""
        started = time.perf_counter()
        needs_velocity = self.hyperparameters.momentum != 0
        for name, weight in self.weights.items():
            velocity = self.velocities.get(name)
            if velocity is None and needs_velocity:
                velocity = self.velocities[name] = np.zeros_like(weight)
            apply_update(weight, velocity, gradients[name], self.hyperparameters)
        self.version += 1
        self.apply_seconds_total += time.perf_counter() - started

    def weight_chunks(self) -> list[bytes]:
        """The current weights as serialized `PullReply` chunk messages, built once per
        version and shared by every caller that pulls it."""
        if self._pull_cache is None or self._pull_cache[0] != self.version:
            chunks = list(tensors.encode_messages(pb.PullReply, self.weights))
            self._pull_cache = (self.version, chunks)
        return self._pull_cache[1]

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Copies of the weights and momentum buffers, for a checkpoint."""
        return (
            {name: w.copy() for name, w in self.weights.items()},
            {name: v.copy() for name, v in self.velocities.items()},
        )
