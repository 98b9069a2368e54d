"""Hardware efficiency learnt from measurements alone, for clusters without a profile.

The per-group step latency grows with the group's share of the work and a fixed cost,
L(g) = c g / N + t0, and g groups overlap their steps, so seconds per update follow
a + b / g (with a = c / N, b = t0). Two numbers of groups measured fix both; from one,
the model assumes no gain from more groups, the cautious guess.
"""

import numpy as np


class MeasuredHardwareModel:
    """Predicts seconds per update for any number of groups from the ones measured.

    Example:

    >>> model = MeasuredHardwareModel(num_workers=4)
    >>> model.observe(1, 0.30)
    0.0
    >>> model.observe(4, 0.15)
    1.0
    >>> round(model.seconds_per_update(2), 3)
    0.2
    """

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._measured: dict[int, list[float]] = {}

    def seconds_per_update(self, num_groups: int) -> float:
        if not self._measured:
            raise ValueError("nothing measured yet")
        groups = np.array(sorted(self._measured), dtype=np.float64)
        seconds = np.array([np.median(self._measured[g]) for g in sorted(self._measured)])
        if len(groups) == 1:
            return float(seconds[0])
        slope, intercept = np.polyfit(1.0 / groups, seconds, 1)
        return float(max(intercept + slope / num_groups, 1e-9))

    def observe(self, num_groups: int, measured_seconds_per_update: float) -> float:
        """Records a measurement; returns the prediction's relative error before it (0 for
        the first)."""
        error = 0.0
        if self._measured:
            predicted = self.seconds_per_update(num_groups)
            error = (predicted - measured_seconds_per_update) / measured_seconds_per_update
        self._measured.setdefault(num_groups, []).append(measured_seconds_per_update)
        return error
