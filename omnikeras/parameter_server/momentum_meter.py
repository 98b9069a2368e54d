"""The total momentum of the updates the server applies, measured from the updates
themselves (closed loop, after YellowFin).

Asynchrony begets momentum only in expectation: an update carries the gradient of one
version, `tau` updates old, and averaged over `tau` a gradient's weight spreads over the
updates after its version as momentum spreads it. So the meter measures that spread: on a
fixed sample of coordinates, each update `d_t = x_{t+1} - x_t`, over its learning rate, is
regressed on the gradients computed at the versions `t, t-1, ..., t-L`,

    -d_t / lr_t = sum_l c_l g_{t-l},

over the last `window` updates (least squares over coordinates and updates, each
coordinate in units of its own gradients). `c_l` is the share of a version's gradients
that lands `l` updates later: the staleness for plain SGD, a geometric tail for momentum
`mu`, their convolution for both. The total momentum is the geometric decay of the same
mean lag `m = sum_l l c_l / sum_l c_l`, that is `m / (1 + m)`: 1 - 1/g for g groups taking
turns, `mu` for synchronous SGD with momentum `mu`. Nothing here reads the staleness the
server records, so the two check each other.

The regression looks back `L` = four times the mean lag that the groups and the explicit
momentum lead one to expect, and 8 more (`lags_for`): lags past the true tail add only
noise to the mean, multiplied by their lag.
"""

import collections
import math
from collections.abc import Mapping, Sequence

import numpy as np

# A few hundred coordinates pin down a handful of coefficients, and keep the meter's work
# per update (one small outer product) far below an update's.
COORDINATES = 512
MAX_LAGS = 64
WINDOW = 256
MIN_UPDATES = 16


def lags_for(num_groups: int, momentum: float) -> int:
    """How far back the regression looks for groups taking turns with this momentum.

    >>> lags_for(1, 0.0), lags_for(4, 0.0), lags_for(1, 0.9)
    (8, 20, 44)
    """
    expected = num_groups - 1 + max(momentum, 0.0) / (1 - momentum)
    return min(round(4 * expected) + 8, MAX_LAGS)


class MomentumMeter:
    """Measures the total momentum of consecutive updates on sampled coordinates.

    Args:
        shapes: Each variable's shape, by name.
        coordinates: How many coordinates to sample, over all variables by size.
        lags: The oldest gradient, in updates, that the regression attributes
            (`lags_for` the layout).
        window: Updates the estimate covers.

    Example:

    >>> meter = MomentumMeter({"w": (1000,)})
    >>> rng = np.random.default_rng(0)
    >>> x = np.zeros(1000)
    >>> for version in range(80):  # synchronous SGD, no momentum
    ...     g = rng.normal(size=1000)
    ...     before = meter.sample({"w": x})
    ...     x = x - 0.1 * g
    ...     meter.record(version, [(version, meter.sample({"w": g}), 1.0)], 0.1, before, meter.sample({"w": x}))
    >>> round(meter.total_momentum(), 3)
    0.0
    """

    def __init__(
        self,
        shapes: Mapping[str, Sequence[int]],
        coordinates: int = COORDINATES,
        lags: int = 8,
        window: int = WINDOW,
        seed: int = 0,
    ) -> None:
        sizes = {name: math.prod(shape) for name, shape in shapes.items()}
        total = sum(sizes.values())
        rng = np.random.default_rng(seed)
        chosen = np.sort(rng.choice(total, size=min(coordinates, total), replace=False)) if total else np.zeros(0, int)
        self._indices: dict[str, np.ndarray] = {}
        offset = 0
        for name, size in sizes.items():
            inside = chosen[(chosen >= offset) & (chosen < offset + size)] - offset
            if len(inside):
                self._indices[name] = inside
            offset += size
        self.lags = lags
        self.window = window
        self.reset()

    def reset(self) -> None:
        """Forgets every update: the next ones no longer continue the last (a restore)."""
        self._updates: dict[int, np.ndarray] = {}
        self._gradients: dict[int, np.ndarray] = {}
        self._rows: collections.deque[tuple[np.ndarray, np.ndarray]] = collections.deque()
        columns = self.lags + 1
        self._xtx = np.zeros((columns, columns))
        self._xty = np.zeros(columns)

    def sample(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """The sampled coordinates of `arrays` (variables by name), as one float64 vector."""
        parts = [np.asarray(arrays[name]).reshape(-1)[indices] for name, indices in self._indices.items()]
        return np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)

    def record(
        self,
        version: int,
        gradients: Sequence[tuple[int, np.ndarray, float]],
        learning_rate: float,
        before: np.ndarray,
        after: np.ndarray,
    ) -> None:
        """Records the update that took the weights from `version` to the next.

        `gradients` are the sampled gradients it combined, each with the version it was
        computed at; `before` and `after` the sampled weights.
        """
        for computed_at, gradient, share in gradients:
            # Everything the workers computed at one version, as much of it as reached an
            # update: members of one step may have computed at different versions, and
            # steps of other groups at the same one.
            self._gradients[computed_at] = self._gradients.get(computed_at, 0.0) + share * gradient
        if learning_rate > 0:
            self._updates[version] = (before - after) / learning_rate
        # An update's row waits until every gradient it may carry has arrived (up to
        # `lags` updates late): one filled in only when it arrived early would tell the
        # regression which one the update carried.
        ready = version - self.lags
        if ready in self._updates:
            self._add_row(ready, self._updates.pop(ready))
        for old in [v for v in self._gradients if v < ready - self.lags]:
            del self._gradients[old]

    def _add_row(self, version: int, update: np.ndarray) -> None:
        zeros = np.zeros_like(update)
        x = np.stack([self._gradients.get(version - lag, zeros) for lag in range(self.lags + 1)], axis=1)
        # Each coordinate's equation in units of its own gradients: a few large
        # coordinates would otherwise decide the fit alone.
        scale = np.sqrt(np.mean(np.square(x), axis=1))
        used = scale > 0
        x, update = x[used] / scale[used, None], update[used] / scale[used]
        row = (x.T @ x, x.T @ update)
        self._rows.append(row)
        self._xtx += row[0]
        self._xty += row[1]
        if len(self._rows) > self.window:
            old_xtx, old_xty = self._rows.popleft()
            self._xtx -= old_xtx
            self._xty -= old_xty

    def spread(self) -> np.ndarray | None:
        """The regression's `c_0..c_L`: how much of a version's gradients lands `l`
        updates later; None before `MIN_UPDATES` updates."""
        if len(self._rows) < MIN_UPDATES:
            return None
        return np.linalg.lstsq(self._xtx, self._xty, rcond=None)[0]

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
