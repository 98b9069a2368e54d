"""Where more groups stop paying: the prototype's rule for the most asynchronous layout."""

from collections.abc import Mapping, Sequence


def most_groups_worth_having(
    seconds_per_update: Mapping[int, float], choices: Sequence[int], min_gain: float = 0.10
) -> int | None:
    """The largest number of groups whose seconds per update are at least `min_gain`
    better than those of the next fewer (the Omnivore prototype's time threshold), or
    the fewest when none is; None while the numbers measured so far cannot tell.

    Measured largest first, the answer often needs only the two largest.

    >>> most_groups_worth_having({8: 0.02, 4: 0.034}, [1, 2, 4, 8])
    8
    >>> most_groups_worth_having({8: 0.48, 4: 0.5}, [1, 2, 4, 8]) is None
    True
    >>> most_groups_worth_having({8: 0.48, 4: 0.5, 2: 0.6}, [1, 2, 4, 8])
    4
    """
    descending = sorted(choices, reverse=True)
    for more, fewer in zip(descending, descending[1:]):
        if more not in seconds_per_update or fewer not in seconds_per_update:
            return None
        if seconds_per_update[more] <= (1 - min_gain) * seconds_per_update[fewer]:
            return more
    return descending[-1]
