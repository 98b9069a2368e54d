"""The total momentum of the updates the server applies, measured from the updates
themselves (closed loop, after YellowFin).

Asynchrony begets momentum only in expectation: an update carries the gradient of one
version, `tau` updates old, and averaged over `tau` a gradient's weight spreads over the
updates after its version as momentum spreads it. So the meter measures that spread: on a
fixed sample of coordinates, each update `d_t = x_{t+1} - x_t`, over the rate it applied,
is resolved into the gradients computed at the versions `t, t-1, ..., t-L`,

    -d_t / lr_t = sum_l w_{t,l} g_{t-l}

(least squares over the coordinates, each in units of its own gradients: exact when the
update is the rate times a combination of those gradients, as SGD's is over its learning
rate). An adaptive optimizer's rate differs by coordinate (`Optimizer.applied_rate`):
Adam's, `alpha_t / (sqrt(v_t) + epsilon)`, leaves its moving average of the gradients, so a
synchronous Adam reads as its `beta_1` (the average's mean lag is heavy-ball momentum
`beta_1`'s); the optimizers that give their learning rate only, whatever they do per
coordinate, read approximately. Averaged over the last `window` updates,
`c_l = mean_t w_{t,l}` is the share of a version's gradients that lands `l` updates later:
the staleness for plain SGD, a geometric tail for momentum `mu`, their convolution for
both. The total momentum is the geometric decay of the same mean lag
`m = sum_l l c_l / sum_l c_l`, that is `m / (1 + m)`: 1 - 1/g for g groups taking turns,
`mu` for synchronous SGD with momentum `mu`. Nothing here reads the staleness the server
records, so the two check each other.

The resolution looks back `L` = four times the mean lag that the groups and the explicit
momentum lead one to expect, and 16 more (`lags_for`): groups are seldom equally fast, and
a stalled group's gradients land late; lags past the true tail add only noise to the mean,
multiplied by their lag. Updates are resolved when the measurement is read (`GetStats`), off
the path of every update, and only those applied `L` updates before the newest, whose
gradients have all arrived. Gradients of one version that land in several updates
(members of one step may have computed at different versions, and steps of other groups at
the same one) are resolved as one, so such updates are resolved approximately.
"""

import collections
import math
import threading
from collections.abc import Mapping, Sequence

import numpy as np

# A few hundred coordinates pin down a few dozen shares. Sampling them and keeping the
# samples is the meter's work per update, 20 to 30 microseconds here (the coordinator alone
# applied about 20% fewer updates per second of the main job's CNN with it than without,
# hence a server measures only when asked); each update's least-squares solve waits until
# the measurement is read.
COORDINATES = 512
MAX_LAGS = 64
WINDOW = 256
MIN_UPDATES = 16
# Fewer sampled coordinates than this, and a variable is not sampled (see `__init__`).
MIN_PER_VARIABLE = 16
# Updates between two sweeps of what the window no longer needs.
PRUNE_EVERY = 64
# A make-up whose shares add up to less than a third of their magnitudes is left out: the
# tail of momentum -0.3 adds up to 0.54 of its magnitudes.
CANCELLING = 3.0


def lags_for(num_groups: int, momentum: float) -> int:
    """How far back the meter looks for groups taking turns with this momentum.

    >>> lags_for(1, 0.0), lags_for(4, 0.0), lags_for(1, 0.9)
    (16, 28, 52)
    """
    expected = num_groups - 1 + max(momentum, 0.0) / (1 - momentum)
    return min(round(4 * expected) + 16, MAX_LAGS)


class MomentumMeter:
    """Measures the total momentum of consecutive updates on sampled coordinates.

    Args:
        weights: The weights by variable name, before the first update it records.
        lags: The oldest gradient, in updates, that an update is resolved into
            (`lags_for` the layout).
        coordinates: How many coordinates to sample, over all variables by size.
        window: Updates the measurement covers.

    Example:

    >>> rng = np.random.default_rng(0)
    >>> x = np.zeros(1000)
    >>> meter = MomentumMeter({"w": x})
    >>> for version in range(80):  # synchronous SGD, no momentum
    ...     g = rng.normal(size=1000)
    ...     x = x - 0.1 * g
    ...     meter.record(version, [(version, meter.sample({"w": g}), 1.0)], 0.1, {"w": x})
    >>> abs(round(meter.total_momentum(), 3))
    0.0
    """

    def __init__(
        self,
        weights: Mapping[str, np.ndarray],
        lags: int = 8,
        coordinates: int = COORDINATES,
        window: int = WINDOW,
        seed: int = 0,
    ) -> None:
        sizes = {name: int(np.size(array)) for name, array in weights.items()}
        total = sum(sizes.values())
        rng = np.random.default_rng(seed)
        chosen = np.sort(rng.choice(total, size=min(coordinates, total), replace=False)) if total else np.zeros(0, int)
        by_variable: dict[str, np.ndarray] = {}
        offset = 0
        for name, size in sizes.items():
            by_variable[name] = chosen[(chosen >= offset) & (chosen < offset + size)] - offset
            offset += size
        # Sampling costs a few microseconds per variable on every update: variables with
        # a handful of coordinates (biases, mostly) are left out, unless all are small.
        kept = {name: indices for name, indices in by_variable.items() if len(indices) >= MIN_PER_VARIABLE}
        self._indices = kept or {name: indices for name, indices in by_variable.items() if len(indices)}
        self._sampled = sum(len(indices) for indices in self._indices.values())
        self.lags = lags
        self.window = window
        # Recording happens on the server's update path and reading beside it: the lock
        # is held for dictionary work only, never for a solve.
        self._lock = threading.Lock()
        # The sampled weights after the last update: the next update starts from them.
        self._weights = self.sample(weights)
        # By version: each update over its learning rate, until it is resolved.
        self._updates: dict[int, np.ndarray] = {}
        self._newest = -1
        # By version: the share-weighted sum of the gradients computed at it.
        self._gradients: dict[int, np.ndarray] = {}
        # Each update's make-up: the share of every version's gradients in it.
        self._compositions: collections.deque[np.ndarray] = collections.deque()
        self._total = np.zeros(self.lags + 1)

    def sample(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """The sampled coordinates of `arrays` (variables by name), as one float64 vector."""
        sampled = np.empty(self._sampled)
        start = 0
        for name, indices in self._indices.items():
            sampled[start : start + len(indices)] = np.ravel(arrays[name])[indices]
            start += len(indices)
        return sampled

    @property
    def variables(self) -> tuple[str, ...]:
        """The variables sampled, in the order of `sample`'s vector."""
        return tuple(self._indices)

    def sample_of(self, name: str, array: np.ndarray) -> np.ndarray:
        """The sampled coordinates of one array of variable `name` (its optimizer state,
        say), in its own dtype."""
        return np.ravel(array)[self._indices[name]]

    def joined(self, values: Mapping[str, float | np.ndarray]) -> np.ndarray:
        """Values of the sampled variables, each one number for all its sampled
        coordinates or one per coordinate (as `sample_of` orders them), as one vector in
        `sample`'s order."""
        joined = np.empty(self._sampled)
        start = 0
        for name, indices in self._indices.items():
            joined[start : start + len(indices)] = values[name]
            start += len(indices)
        return joined

    def record(
        self,
        version: int,
        gradients: Sequence[tuple[int, np.ndarray, float]],
        rate: float | np.ndarray,
        weights: Mapping[str, np.ndarray],
    ) -> None:
        """Records the update that took the weights from `version` to the next.

        `gradients` are the sampled gradients it combined, each with the version it was
        computed at and its share of the combination; `rate` the rate it was applied
        with, one for all coordinates or one for each sampled coordinate (`joined`; see
        `Optimizer.applied_rate`); `weights` the weights after it (nothing else changes
        them between two updates: a restore starts a new meter).
        """
        after = self.sample(weights)
        # A coordinate whose rate is 0 or not finite (a schedule's rate of 0; Adam's over a
        # moment of 0 with an epsilon of 0) says nothing of its gradients' make-up: it is
        # left out of its update's resolution rather than turned into NaN or Inf shares.
        followed = np.isfinite(rate) & (np.asarray(rate) > 0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            update = np.where(followed, (self._weights - after) / rate, np.nan)
        with self._lock:
            for computed_at, gradient, share in gradients:
                # Everything the workers computed at one version, as much of it as reached
                # an update: members of one step may have computed at different versions,
                # and steps of other groups at the same one.
                part = gradient if share == 1 else share * gradient
                self._gradients[computed_at] = self._gradients.get(computed_at, 0.0) + part
            if followed.any():
                self._updates[version] = update
            self._weights = after
            self._newest = max(self._newest, version)
            if version % PRUNE_EVERY:
                return
            # Kept until the updates are resolved, when the measurement is read: updates
            # that would have left the window by then, and the gradients only they could
            # carry, are dropped.
            for kept, oldest in (
                (self._updates, self._newest - self.lags - self.window),
                (self._gradients, self._newest - 2 * self.lags - self.window),
            ):
                for old in [v for v in kept if v < oldest]:
                    del kept[old]

    def _resolve_ready(self) -> None:
        """Resolves the updates whose gradients have all arrived (up to `lags` updates
        late), so that each version's gradients are whole; their gradients stay for the
        updates after them."""
        with self._lock:
            ready = sorted(v for v in self._updates if v <= self._newest - self.lags)
            # The arrays are never changed in place, only replaced: safe to read unlocked.
            work = [
                (self._updates.pop(v), [self._gradients.get(v - lag) for lag in range(self.lags + 1)]) for v in ready
            ]
        compositions = [c for c in (_resolve(update, gradients) for update, gradients in work) if c is not None]
        with self._lock:
            for composition in compositions:
                self._compositions.append(composition)
                self._total += composition
                if len(self._compositions) > self.window:
                    self._total -= self._compositions.popleft()

    def spread(self) -> np.ndarray | None:
        """`c_0..c_L`: how much of a version's gradients lands `l` updates later, on
        average over the window; None before `MIN_UPDATES` updates."""
        self._resolve_ready()
        with self._lock:
            if len(self._compositions) < MIN_UPDATES:
                return None
            return self._total / len(self._compositions)

    def total_momentum(self) -> float:
        """The measured total momentum; NaN until enough updates, or when the updates do
        not follow the gradients (a learning rate of 0)."""
        spread = self.spread()
        if spread is None:
            return math.nan
        weight = float(spread.sum())
        if abs(weight) < 1e-12:
            return math.nan
        lag = float(np.arange(len(spread)) @ spread) / weight
        return lag / (1 + lag) if lag > -1 else math.nan


def _resolve(update: np.ndarray, gradients: list[np.ndarray | None]) -> np.ndarray | None:
    """The shares of `gradients` (by lag; None where no worker computed at that version)
    that make up `update`, or None when they cannot be told apart."""
    zeros = np.zeros_like(update)
    x = np.stack([zeros if g is None else g for g in gradients], axis=1)
    # Each coordinate's equation in units of its own gradients: a few large coordinates
    # would otherwise decide the fit alone.
    scale = np.sqrt(np.mean(np.square(x), axis=1))
    used = (scale > 0) & np.isfinite(update)
    x, update = x[used] / scale[used, None], update[used] / scale[used]
    normal = x.T @ x
    # A version without gradients: the tiny ridge leaves its share at zero instead of
    # making the equations singular.
    normal[np.diag_indices_from(normal)] += 1e-9 * max(float(np.trace(normal)), 1e-300)
    composition = np.linalg.solve(normal, x.T @ update)
    if np.abs(composition).sum() > CANCELLING * abs(composition.sum()):
        # Large shares that cancel: gradients too alike to tell apart (early in training,
        # where they share one direction), not a make-up.
        return None
    return composition
