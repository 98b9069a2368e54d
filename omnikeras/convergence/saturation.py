"""Where more groups stop paying: the prototype's rule for the most asynchronous layout."""

from collections.abc import Callable


def saturation_groups(num_workers: int, seconds_per_update: Callable[[int], float], min_gain: float = 0.10) -> int:
    """The largest number of groups worth having: starting from 1, groups grow to the next
    divisor of the workers while each step is at least `min_gain` faster per update.

    >>> saturation_groups(8, lambda g: {1: 1.0, 2: 0.6, 4: 0.5, 8: 0.48}[g])
    4
    """
    candidates = [g for g in range(1, num_workers + 1) if num_workers % g == 0]
    best = candidates[0]
    for more in candidates[1:]:
        if seconds_per_update(more) > (1 - min_gain) * seconds_per_update(best):
            break
        best = more
    return best
