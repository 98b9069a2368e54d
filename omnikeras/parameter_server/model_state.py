"""The weights the server holds, their momentum buffers, version, iteration count and
update rule.

Not thread-safe on its own: `GroupCoordinator` calls it under its lock.
"""

import threading
import time
from collections.abc import Iterator, Mapping

import numpy as np

from omnikeras.parameter_server import tensors
from omnikeras.parameter_server.errors import FailedPrecondition
from omnikeras.parameter_server.update_rule import Hyperparameters, apply_update, apply_weight_decay
from omnikeras.v1 import parameter_server_pb2 as pb


class ModelState:
    def __init__(self, hyperparameters: Hyperparameters) -> None:
        self.hyperparameters = hyperparameters
        self.weights: dict[str, np.ndarray] = {}
        self.velocities: dict[str, np.ndarray] = {}
        self.specs: dict[str, tensors.VariableSpec] = {}
        self.version = 0
        # Updates applied, as Keras' `optimizer.iterations` counts them: schedules read it.
        # Unlike the version, a restored snapshot does not change it.
        self.iterations = 0
        self.apply_seconds_total = 0.0
        self._pull_cache: _EncodedWeights | None = None

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
        if self._pull_cache is not None:
            # Pulls of the version about to be replaced may still be reading it.
            self._pull_cache.finish()
        rule = self.hyperparameters
        learning_rate = rule.learning_rate_at(self.iterations)
        needs_velocity = rule.momentum != 0
        for name, weight in self.weights.items():
            if name in rule.statistics:
                weight += gradients[name]
                continue
            velocity = self.velocities.get(name)
            if velocity is None and needs_velocity:
                velocity = self.velocities[name] = np.zeros_like(weight)
            if rule.decays(name):
                apply_weight_decay(weight, learning_rate * rule.weight_decay)
            apply_update(weight, velocity, gradients[name], learning_rate, rule.momentum, rule.nesterov)
        self.version += 1
        self.iterations += 1
        self.apply_seconds_total += time.perf_counter() - started

    def weight_chunks(self) -> "_EncodedWeights":
        """The current weights as serialized `PullReply` chunk messages, encoded once per
        version and shared by every caller that pulls it. The caller may iterate over them
        after releasing the lock (see `_EncodedWeights`)."""
        if self._pull_cache is None or self._pull_cache.version != self.version:
            self._pull_cache = _EncodedWeights(self.version, self.weights)
        return self._pull_cache

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Copies of the weights and momentum buffers, for a checkpoint."""
        return (
            {name: w.copy() for name, w in self.weights.items()},
            {name: v.copy() for name, v in self.velocities.items()},
        )


class _EncodedWeights:
    """One version of the weights as serialized `PullReply` chunk messages, encoded as
    they are first read rather than all before the first one is sent: a pull's first
    chunks are on their way while the rest are encoded (for 100 MB, encoding takes 12 ms).

    Reading happens outside the coordinator's lock, so `ModelState.apply` calls `finish`
    before it changes the weights in place; from then on, the chunks are read from here
    only. (`ModelState.initialize` puts new arrays in place of the old ones, which stay as
    they are for the readers of their version.)
    """

    def __init__(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        self.version = version
        self._lock = threading.Lock()
        self._chunks: list[bytes] = []
        self._unread: Iterator[bytes] | None = tensors.encode_messages(pb.PullReply, dict(weights))

    def __iter__(self) -> Iterator[bytes]:
        index = 0
        while True:
            with self._lock:
                if index == len(self._chunks):
                    chunk = next(self._unread, None) if self._unread is not None else None
                    if chunk is None:
                        self._unread = None
                        return
                    self._chunks.append(chunk)
                chunk = self._chunks[index]
            yield chunk
            index += 1

    def finish(self) -> None:
        """Encodes what no reader has reached yet."""
        with self._lock:
            if self._unread is not None:
                self._chunks.extend(self._unread)
                self._unread = None
