"""Statistical efficiency: how many updates the loss needs to reach the target.

A short trial gives the training loss after each update. Its log falls roughly linearly
in the number of updates over a short horizon, so the slope of a least-squares line
through the log-losses of most of the trial gives a rate, and

    updates to target = ln(last loss / target loss) / rate

The first quarter of a trial is left out: a new learning rate or momentum, or a new
group layout, takes a few updates to show its pace.
"""

import math
from collections.abc import Sequence

import numpy as np


def updates_to_target(
    updates: Sequence[float], losses: Sequence[float], target_loss: float, skip_fraction: float = 0.25
) -> float:
    """Predicted updates from the end of the trial until the loss reaches `target_loss`.

    Args:
        updates: The server's update count at each loss measurement, increasing.
        losses: The training loss measured at each of those points.
        target_loss: The loss to reach; must be positive.
        skip_fraction: Share of the first measurements left out. Defaults to 0.25.

    Returns:
        0 if the loss is already at the target; `inf` if it does not fall, is not finite,
        or there are too few measurements to tell.

    >>> round(updates_to_target([0, 10, 20, 30], [2.0, 1.0, 0.5, 0.25], 0.125, skip_fraction=0), 6)
    10.0
    """
    if target_loss <= 0:
        raise ValueError(f"target_loss must be positive, got {target_loss}")
    x = np.asarray(updates, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    if len(x) != len(y):
        raise ValueError("one loss per update count is needed")
    if len(y) == 0 or not np.all(np.isfinite(y)) or np.any(y <= 0):
        return math.inf
    start = int(len(y) * skip_fraction)
    x, y = x[start:], y[start:]
    if len(y) < 3 or np.ptp(x) == 0:
        return math.inf
    slope, intercept = np.polyfit(x, np.log(y), 1)
    if slope >= 0:
        return math.inf
    # The fitted line's end, not the last noisy loss, is where the trial left off.
    level = intercept + slope * x[-1]
    return max(0.0, float((level - math.log(target_loss)) / -slope))
