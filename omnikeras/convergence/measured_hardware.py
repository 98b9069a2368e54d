"""Hardware efficiency learnt from measurements alone, for clusters without a profile.

The per-group step latency grows with the group's share of the work and a fixed cost,
L(g) = c g / N + t0, and g groups overlap their steps, so seconds per update follow
a + b / g (with a = c / N, b = t0). Two numbers of groups measured fix both; from one,
the model assumes no gain from more groups, the cautious guess.

Where more groups gain more than in proportion (a < 0: on a cluster bound by the server's
link, the synchronous layout sends every member's gradients and then receives every
member's weights, while groups overlap one's sending with another's receiving), a + b / g
would reach zero; the model then follows the measured slope on a log-log scale,
seconds per update = A g^-k.
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

    Gaining more than in proportion, it follows the log-log slope:

    >>> model = MeasuredHardwareModel(num_workers=8)
    >>> model.observe(1, 0.6), round(model.observe(2, 0.25), 3)
    (0.0, 1.4)
    >>> round(model.seconds_per_update(4), 4)
    0.1042
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
        if intercept >= 0:
            return float(intercept + slope / num_groups)
        exponent, log_scale = np.polyfit(np.log(groups), np.log(seconds), 1)
        return float(np.exp(log_scale + exponent * np.log(num_groups)))

    def observe(self, num_groups: int, measured_seconds_per_update: float) -> float:
        """Records a measurement; returns the prediction's relative error before it (0 for
        the first)."""
        error = 0.0
        if self._measured:
            predicted = self.seconds_per_update(num_groups)
            error = (predicted - measured_seconds_per_update) / measured_seconds_per_update
        self._measured.setdefault(num_groups, []).append(measured_seconds_per_update)
        return error
