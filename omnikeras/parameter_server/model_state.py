"""The weights the server holds, the optimizer's state, version, iteration count and
update rule.

Not thread-safe on its own: `GroupCoordinator` calls it under its lock.

An update that would make a weight or the optimizer's state NaN or Inf is refused, and
both stay as they were. Under SGD, finite weights, momentum buffers and gradients can
only produce NaN or Inf by overflowing, so the state keeps a bound on every array's
largest magnitude, carried from update to update with the gradients' sums of magnitudes
(which the server's finiteness check measures as they arrive); only an update whose bound
comes near the dtype's limit is measured exactly and, if still near it, tried on copies
first. The other optimizers divide and take roots, which no cheap bound follows: their
updates are computed into new arrays and checked before they are put in place.
"""

import math
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from omnikeras.parameter_server import tensors
from omnikeras.parameter_server.errors import FailedPrecondition, NonFinite
from omnikeras.parameter_server.optimizers import Step
from omnikeras.parameter_server.optimizers.base import Slots, decayed
from omnikeras.parameter_server.optimizers.sgd import SGD, apply_weight_decay
from omnikeras.parameter_server.server_state import Arrays, OptimizerState
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.v1 import parameter_server_pb2 as pb


class ModelState:
    def __init__(self, hyperparameters: Hyperparameters) -> None:
        self._hyperparameters = hyperparameters
        self.weights: dict[str, np.ndarray] = {}
        # The optimizer's state of each variable, by Keras' names: SGD's "momentum",
        # Adam's "momentum" and "velocity", ...
        self.slots: OptimizerState = {}
        self.specs: dict[str, tensors.VariableSpec] = {}
        self.version = 0
        # Updates applied, as Keras' `optimizer.iterations` counts them: schedules read it.
        # Unlike the version, a restored snapshot does not change it.
        self.iterations = 0
        self.apply_seconds_total = 0.0
        self._pull_cache: _EncodedWeights | None = None
        # Upper bounds on each variable's largest magnitude, exact when first needed.
        self._bounds: dict[str, _Bounds] = {}

    @property
    def hyperparameters(self) -> Hyperparameters:
        return self._hyperparameters

    @hyperparameters.setter
    def hyperparameters(self, rule: Hyperparameters) -> None:
        """A new rule; another optimizer, or other settings of it, start from fresh state,
        as a newly compiled Keras optimizer does (the state is each optimizer's own)."""
        before = self._hyperparameters
        if (rule.optimizer, rule.settings) != (before.optimizer, before.settings):
            self.slots = {}
            self._bounds = {}
        self._hyperparameters = rule

    def restart_optimizer(self) -> None:
        """Starts the optimizer afresh, as a newly compiled Keras optimizer: no state, and
        no iteration (a schedule starts over)."""
        self.slots = {}
        self._bounds = {}
        self.iterations = 0

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
        slots: OptimizerState | None = None,
    ) -> None:
        self.weights = {name: tensors.little_endian(w) for name, w in weights.items()}
        self.specs = {name: tensors.VariableSpec.of(name, w) for name, w in self.weights.items()}
        self.slots = {name: dict(state) for name, state in (slots or {}).items()}
        self.version = version
        self._pull_cache = None
        self._bounds = {}

    def require_initialized(self) -> None:
        if not self.initialized:
            raise FailedPrecondition("the model is not initialised yet: call InitModel first")

    def apply(
        self,
        gradients: Mapping[str, np.ndarray],
        magnitudes: Mapping[str, float] | None = None,
        learning_rate: float | None = None,
        momentum: float | None = None,
    ) -> None:
        """Applies one update; the gradient arrays are consumed as scratch space.

        `magnitudes` bound each gradient's largest magnitude (sums of magnitudes, as the
        server's finiteness check measures them); without them, they are measured here.
        `learning_rate` and `momentum` (the momentum-like setting) replace the rule's
        (compensated asynchrony); None applies the rule's. Raises `NonFinite`, with
        nothing changed, when the update would make a weight or the optimizer's state NaN
        or Inf.
        """
        started = time.perf_counter()
        rule = self.hyperparameters
        step = Step(
            rule.learning_rate_at(self.iterations) if learning_rate is None else learning_rate,
            rule.momentum if momentum is None else momentum,
            self.iterations,
        )
        if isinstance(rule.rule, SGD):
            self._apply_bounded(gradients, magnitudes, step)
        else:
            self._apply_checked(gradients, step)
        self.version += 1
        self.iterations += 1
        self.apply_seconds_total += time.perf_counter() - started

    def add_statistics(self, changes: Mapping[str, np.ndarray]) -> None:
        """Adds `changes` to the statistics they name, and nothing else: the update of a
        skipped step (see `GroupCoordinator.push`), which the iterations do not count.
        Raises `NonFinite`, with nothing changed, when a statistic would hold NaN or Inf."""
        if not changes:
            return
        with np.errstate(over="ignore", invalid="ignore"):
            updated = {name: self.weights[name] + change for name, change in changes.items()}
        for name, weight in updated.items():
            if not math.isfinite(tensors.abs_sum(weight)):
                raise NonFinite("update of", name)
        self._finish_pulls()
        for name, weight in updated.items():
            self.weights[name] = weight
            # Measured afresh when SGD's next update needs it.
            self._bounds.pop(name, None)
        self.version += 1

    def _apply_bounded(
        self, gradients: Mapping[str, np.ndarray], magnitudes: Mapping[str, float] | None, step: Step
    ) -> None:
        """SGD's update, in place: its bound on the weights' magnitudes is cheap to carry,
        so only an update that comes near the dtype's limit is tried on copies first."""
        if magnitudes is None:
            magnitudes = {name: tensors.abs_sum(gradient) for name, gradient in gradients.items()}
        bounds = {name: self._bounds_after(name, magnitudes[name], step) for name in gradients}
        near_limit = [name for name, bound in bounds.items() if not bound.within(self.weights[name].dtype)]
        for name in near_limit:
            # The carried bounds only ever grow: measured afresh, they may be far lower.
            self._bounds[name] = _Bounds.exact(self.weights[name], self._velocity(name))
            bounds[name] = self._bounds_after(name, magnitudes[name], step)
        tried = {
            name: self._updated(name, gradients[name], step)
            for name in near_limit
            if not bounds[name].within(self.weights[name].dtype)
        }
        self._finish_pulls()
        for name, weight in self.weights.items():
            if name in tried:
                updated, slots = tried[name]
                np.copyto(weight, updated)
                self.slots[name] = slots
                bounds[name] = _Bounds.exact(updated, self._velocity(name))
            else:
                self._update(name, weight, self.slots.setdefault(name, {}), gradients[name], step)
        self._bounds = bounds

    def _apply_checked(self, gradients: Mapping[str, np.ndarray], step: Step) -> None:
        """Any other optimizer's update, computed into new arrays and put in place only
        when every weight and every array of the optimizer's state is finite."""
        updated = {name: self._updated(name, gradient, step) for name, gradient in gradients.items()}
        self._finish_pulls()
        for name, (weight, slots) in updated.items():
            self.weights[name] = weight
            self.slots[name] = slots

    def _finish_pulls(self) -> None:
        if self._pull_cache is not None:
            # Pulls of the version about to be replaced may still be reading it.
            self._pull_cache.finish()

    def _velocity(self, name: str) -> np.ndarray | None:
        return self.slots.get(name, {}).get("momentum")

    def _update(self, name: str, weight: np.ndarray, slots: Slots, gradient: np.ndarray, step: Step) -> None:
        """SGD's update of `weight` and its `slots`, in place."""
        rule = self.hyperparameters
        assert isinstance(rule.rule, SGD)
        if name in rule.statistics:
            weight += gradient
            return
        if rule.decays(name):
            apply_weight_decay(weight, step.learning_rate * rule.weight_decay)
        rule.rule.update_in_place(weight, gradient, slots, step)

    def _updated(self, name: str, gradient: np.ndarray, step: Step) -> tuple[np.ndarray, Slots]:
        """The weight and optimizer state of `name` after the update, as new arrays (the
        optimizer's state created on the variable's first update); raises `NonFinite`
        if any holds NaN or Inf."""
        rule = self.hyperparameters
        weight = self.weights[name]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if name in rule.statistics:
                weight, slots = weight + gradient, self.slots.get(name, {})
            else:
                slots = self.slots.get(name) or rule.rule.slots(weight, step)
                if rule.decays(name):
                    weight = decayed(weight, step.learning_rate * rule.weight_decay)
                weight, slots = rule.rule.update(weight, gradient, slots, step)
        for array in (weight, *slots.values()):
            if not math.isfinite(tensors.abs_sum(array)):
                raise NonFinite("update of", name)
        return weight, slots

    def _bounds_after(self, name: str, change: float, step: Step) -> "_Bounds":
        """Bounds on `name`'s largest magnitudes once SGD applies a gradient whose
        magnitudes are bounded by `change`."""
        if name not in self._bounds:
            self._bounds[name] = _Bounds.summed(self.weights[name], self._velocity(name))
        before = self._bounds[name]
        rule = self.hyperparameters
        if name in rule.statistics:
            return _Bounds(before.weight + change, before.velocity)
        learning_rate, momentum = step.learning_rate, step.momentum
        update = learning_rate * change
        decayed = before.weight * (abs(1 - learning_rate * rule.weight_decay) if rule.decays(name) else 1.0)
        if self._velocity(name) is None and momentum == 0:
            return _Bounds(decayed + update, 0.0)
        velocity = abs(momentum) * before.velocity + update
        if rule.rule.flag("nesterov"):
            return _Bounds(decayed + abs(momentum) * velocity + update, velocity)
        return _Bounds(decayed + velocity, velocity)

    def weight_chunks(self) -> "_EncodedWeights":
        """The current weights as serialized `PullReply` chunk messages, encoded once per
        version and shared by every caller that pulls it. The caller may iterate over them
        after releasing the lock (see `_EncodedWeights`)."""
        if self._pull_cache is None or self._pull_cache.version != self.version:
            self._pull_cache = _EncodedWeights(self.version, self.weights)
        return self._pull_cache

    def snapshot(self) -> Arrays:
        """Copies of the weights and the optimizer's state, for a checkpoint."""
        return (
            {name: w.copy() for name, w in self.weights.items()},
            {name: {slot: a.copy() for slot, a in slots.items()} for name, slots in self.slots.items()},
        )


@dataclass(frozen=True)
class _Bounds:
    """Upper bounds on the largest magnitude in a weight and in its momentum buffer."""

    weight: float
    velocity: float

    @classmethod
    def summed(cls, weight: np.ndarray, velocity: np.ndarray | None) -> "_Bounds":
        """Loose bounds (sums of magnitudes), in one pass with no temporary."""
        return cls(tensors.abs_sum(weight), tensors.abs_sum(velocity) if velocity is not None else 0.0)

    @classmethod
    def exact(cls, weight: np.ndarray, velocity: np.ndarray | None) -> "_Bounds":
        return cls(_largest(weight), _largest(velocity) if velocity is not None else 0.0)

    def within(self, dtype: np.dtype) -> bool:
        """Whether no sum of terms so bounded can overflow `dtype`."""
        limit = _LIMITS[dtype]
        return self.weight <= limit and self.velocity <= limit


# A quarter of each dtype's largest value: sums of a few terms below it stay finite.
_LIMITS = {np.dtype(t): float(np.finfo(t).max) / 4 for t in (np.float16, np.float32, np.float64)}


def _largest(array: np.ndarray) -> float:
    return float(np.abs(array).max()) if array.size else 0.0


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
