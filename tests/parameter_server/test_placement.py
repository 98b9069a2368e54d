import pytest

from omnikeras.parameter_server.placement import balance_by_bytes


def test_shards_hold_about_equal_bytes() -> None:
    sizes = {f"v{i}": size for i, size in enumerate([900, 500, 400, 300, 200, 100, 100])}
    placement = balance_by_bytes(sizes, 2)
    loads = [sum(sizes[n] for n, s in placement.items() if s == shard) for shard in (0, 1)]
    assert sorted(loads) == [1200, 1300]


def test_placement_does_not_depend_on_order() -> None:
    sizes = {"a": 10, "b": 10, "c": 30, "d": 5}
    reordered = dict(reversed(list(sizes.items())))
    assert balance_by_bytes(sizes, 3) == balance_by_bytes(reordered, 3)


def test_one_shard_takes_everything() -> None:
    assert set(balance_by_bytes({"a": 1, "b": 2}, 1).values()) == {0}


def test_no_shards_is_an_error() -> None:
    with pytest.raises(ValueError, match="num_shards"):
        balance_by_bytes({"a": 1}, 0)
