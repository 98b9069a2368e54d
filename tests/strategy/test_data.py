"""Every worker's part of the data: together they read each example once per epoch."""

import numpy as np
import pytest
import tensorflow as tf

from omnikeras.strategy import data
from omnikeras.strategy.worker import GroupPlace


def _places(groups: list[list[float]]) -> list[GroupPlace]:
    places = []
    for group, throughputs in enumerate(groups):
        boundaries = tuple(np.concatenate([[0.0], np.cumsum(throughputs) / sum(throughputs)]))
        for index in range(len(throughputs)):
            places.append(GroupPlace(group, len(groups), tuple(range(len(throughputs))), boundaries, index))
    return places


@pytest.mark.parametrize("groups", [[[1.0]], [[1.0], [1.0], [1.0]], [[1.0, 3.0], [1.0, 1.0]], [[2.0, 1.0, 1.0]]])
def test_workers_read_each_example_once(groups: list[list[float]]) -> None:
    x = np.arange(200, dtype=np.float32)[:, None]
    y = np.arange(200)
    members = max(len(g) for g in groups)
    seen = []
    for place in _places(groups):
        # Each worker builds its own pipeline, as each worker process does.
        batches = data.training_batches(x, y, None, 20, shuffle=True, seed=3, drop_remainder=members > 1)
        steps = 0
        for xb, yb in data.worker_shard(batches, place):
            np.testing.assert_array_equal(xb[:, 0].numpy(), yb.numpy())
            assert len(yb) == data.rows_per_member(20, place)[place.member_index]
            seen.extend(yb.numpy().tolist())
            steps += 1
        assert steps == len(range(place.group, 10, place.num_groups))
    assert sorted(seen) == list(range(200))


def test_workers_agree_on_every_epoch_s_shuffle() -> None:
    def epochs(seed: int) -> list[list[int]]:
        batches = data.training_batches(np.arange(50), None, None, 10, shuffle=True, seed=seed, drop_remainder=False)
        return [np.concatenate(list(batches.as_numpy_iterator())).tolist() for _ in range(3)]

    first, second = epochs(seed=7), epochs(seed=7)
    assert first == second
    assert first[0] != first[1], "each epoch is shuffled anew"


def test_a_three_times_faster_member_gets_three_times_the_rows() -> None:
    slow, fast = _places([[1.0, 3.0]])
    assert list(data.rows_per_member(64, slow)) == [16, 48]
    assert fast.stop - fast.start == pytest.approx(3 * (slow.stop - slow.start))


def test_datasets_of_uneven_batches_skip_the_ones_too_short_to_share() -> None:
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(10)).batch(4)  # 4, 4, 2 rows
    place = _places([[1.0, 1.0, 1.0]])[0]
    assert [len(b) for b in data.worker_shard(dataset, place)] == [1, 1]


def test_a_batch_too_small_for_its_group_is_refused() -> None:
    batches = data.training_batches(np.zeros((10, 1)), np.zeros(10), None, 2, False, 0, drop_remainder=True)
    with pytest.raises(ValueError, match="raise the batch size"):
        data.worker_shard(batches, _places([[1.0, 1.0, 1.0]])[0])


def test_validation_split_takes_the_last_rows() -> None:
    x, y = np.arange(10), np.arange(10) * 2
    (xt, yt, sw), (xv, yv) = data.split_validation(x, y, None, 0.3)
    assert list(xt) == list(range(7)) and list(yv) == [14, 16, 18] and sw is None


def test_unsupported_inputs_are_refused() -> None:
    with pytest.raises(TypeError, match="NumPy arrays"):
        data.training_batches(iter([1, 2]), None, None, 2, False, 0, False)
    with pytest.raises(ValueError, match="inside the dataset"):
        data.training_batches(tf.data.Dataset.range(3), np.zeros(3), None, 2, False, 0, False)
