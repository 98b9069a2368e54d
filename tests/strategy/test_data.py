"""Every worker's part of the data: together they read each example once per epoch."""

import numpy as np
import pytest
import tensorflow as tf

from omnikeras.strategy import data
from omnikeras.strategy.place import GroupPlace
from omnikeras.v1 import parameter_server_pb2 as pb


def _places(groups: list[list[float]]) -> list[GroupPlace]:
    """Every worker's place, for groups given as their members' throughputs."""
    throughputs: dict[int, float] = {}
    stats = []
    for group, members in enumerate(groups):
        ids = [len(throughputs) + 1 + i for i in range(len(members))]
        throughputs.update(zip(ids, members))
        stats.append(pb.GroupStats(group=group, members=ids))
    return [GroupPlace.of(w, stats, throughputs.__getitem__) for w in throughputs]


def _read(batches: tf.data.Dataset, place: GroupPlace, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    placement = data.DataPlacement()
    placement.update(place)
    return [(x.numpy(), y.numpy()) for x, y in data.worker_shard(batches, placement).take(steps)]


@pytest.mark.parametrize("groups", [[[1.0]], [[1.0], [1.0], [1.0]], [[1.0, 3.0], [1.0, 1.0]], [[2.0, 1.0, 1.0]]])
def test_workers_read_each_example_once(groups: list[list[float]]) -> None:
    x = np.arange(200, dtype=np.float32)[:, None]
    seen = []
    for place in _places(groups):
        # Each worker builds its own pipeline, as each worker process does.
        batches = data.training_batches(x, np.arange(200), None, 20, shuffle=True, seed=3)
        steps = len(range(place.group, 10, place.num_groups))
        for xb, yb in _read(batches, place, steps):
            np.testing.assert_array_equal(xb[:, 0], yb)
            assert len(yb) == place.rows_per_member(20)[place.member_index]
            seen.extend(yb.tolist())
    assert sorted(seen) == list(range(200))


def test_a_new_place_takes_effect_without_a_new_pipeline() -> None:
    batches = tf.data.Dataset.range(40).batch(4).repeat()
    alone, *_ = _places([[1.0]])
    first_of_two, _ = _places([[1.0, 1.0]])
    placement = data.DataPlacement()
    placement.update(alone)
    stream = iter(data.worker_shard(batches, placement))
    assert next(stream).numpy().tolist() == [0, 1, 2, 3]
    placement.update(first_of_two)
    next(stream)  # the one batch read ahead under the old place
    assert len(next(stream)) == 2


def test_workers_agree_on_every_epoch_s_shuffle() -> None:
    def epochs(seed: int) -> list[list[int]]:
        batches = data.training_batches(np.arange(50), None, None, 10, shuffle=True, seed=seed)
        return [np.concatenate(list(batches.as_numpy_iterator())).tolist() for _ in range(3)]

    first, second = epochs(seed=7), epochs(seed=7)
    assert first == second
    assert first[0] != first[1], "each epoch is shuffled anew"


def test_a_three_times_faster_member_gets_three_times_the_rows() -> None:
    slow, fast = _places([[1.0, 3.0]])
    assert list(slow.rows_per_member(64)) == [16, 48]
    assert fast.stop - fast.start == pytest.approx(3 * (slow.stop - slow.start))


def test_batches_too_short_to_share_are_skipped() -> None:
    dataset = tf.data.Dataset.from_tensor_slices((np.arange(10), np.arange(10))).batch(4)  # 4, 4, 2 rows
    first, *_ = _places([[1.0, 1.0, 1.0]])
    assert first.min_batch_size() == 3
    assert [len(y) for _, y in _read(dataset, first, 10)] == [1, 1]


def test_validation_split_takes_the_last_rows() -> None:
    x, y = np.arange(10), np.arange(10) * 2
    (xt, yt, sw), (xv, yv) = data.split_validation(x, y, None, 0.3)
    assert list(xt) == list(range(7)) and list(yv) == [14, 16, 18] and sw is None


def test_unsupported_inputs_are_refused() -> None:
    with pytest.raises(TypeError, match="NumPy arrays"):
        data.training_batches(iter([1, 2]), None, None, 2, False, 0)
    with pytest.raises(ValueError, match="inside the dataset"):
        data.training_batches(tf.data.Dataset.range(3), np.zeros(3), None, 2, False, 0)
