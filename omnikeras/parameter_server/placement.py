"""Which server shard holds which variable: balanced by bytes, the same on every client."""

from collections.abc import Mapping


def balance_by_bytes(sizes: Mapping[str, int], num_shards: int) -> dict[str, int]:
    """Places each variable on a shard so that the shards hold about equal bytes.

    Largest variables first, each onto the shard that holds the fewest bytes so far (ties
    go to the lower shard, then the earlier name), so every client computes the same
    placement from the same variables.

    >>> balance_by_bytes({"kernel": 400, "bias": 4, "head": 300}, 2)
    {'kernel': 0, 'head': 1, 'bias': 1}
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    loads = [0] * num_shards
    placement = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        shard = min(range(num_shards), key=lambda s: (loads[s], s))
        placement[name] = shard
        loads[shard] += sizes[name]
    return placement
