"""Asynchrony begets momentum.

With `g` groups racing, an update's staleness is roughly geometric, P(tau = l) =
(1 - q) q^l, and asynchronous SGD then behaves like SGD with momentum q: asynchrony
alone brings momentum 1 - 1/g. The total momentum is that plus the explicit momentum of
the update rule, so the explicit one must come down as `g` goes up.
"""

from collections.abc import Mapping


def implicit_momentum(num_groups: int) -> float:
    """The momentum that `num_groups` equally fast groups bring by themselves, 1 - 1/g.

    >>> implicit_momentum(4)
    0.75
    """
    if num_groups < 1:
        raise ValueError(f"num_groups must be at least 1, got {num_groups}")
    return 1.0 - 1.0 / num_groups


def measured_momentum(staleness_histogram: Mapping[int, int]) -> float:
    """The implicit momentum of a running system, from the server's staleness counts.

    For a geometric staleness, mean staleness m = q / (1 - q), so q = m / (1 + m).
    Returns 0 without measurements.

    >>> measured_momentum({0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1})
    0.75
    """
    total = sum(staleness_histogram.values())
    if total == 0:
        return 0.0
    mean = sum(lag * count for lag, count in staleness_histogram.items()) / total
    return mean / (1.0 + mean)
