"""The batches by index and each worker's share: together the workers read each example
once per pass, however the server hands the batches out."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from omnikeras.parameter_server import GroupLayout
from omnikeras.strategy import data
from omnikeras.strategy.place import GroupPlace


def _places(groups: list[list[float]]) -> list[GroupPlace]:
    """Every worker's place, for groups given as their members' throughputs."""
    throughputs: dict[int, float] = {}
    members_of = []
    for members in groups:
        ids = tuple(len(throughputs) + 1 + i for i in range(len(members)))
        throughputs.update(zip(ids, members))
        members_of.append(ids)
    layout = GroupLayout(1, tuple(members_of))
    return [GroupPlace.of(w, layout, throughputs.__getitem__) for w in throughputs]


@pytest.mark.parametrize("groups", [[[1.0]], [[1.0], [1.0], [1.0]], [[1.0, 3.0], [1.0, 1.0]], [[2.0, 1.0, 1.0]]])
def test_members_shares_of_the_batches_cover_each_example_once(groups: list[list[float]]) -> None:
    x = np.arange(200, dtype=np.float32)[:, None]
    seen = []
    places = _places(groups)
    for index in range(10):
        # Groups take turns in any order: the server decides; what matters is the index.
        group = index % len(groups)
        for place in (p for p in places if p.group == group):
            # Each worker has its own source, as each worker process does.
            source = data.ArrayBatches(x, np.arange(200), None, 20, shuffle=True, seed=3)
            xb, yb = data.share(source.batch(index), place)
            np.testing.assert_array_equal(xb[:, 0], yb)
            assert len(yb) == place.rows_per_member(20)[place.member_index]
            seen.extend(yb.tolist())
    assert sorted(seen) == list(range(200))


def test_every_pass_is_shuffled_anew_and_alike_on_every_worker() -> None:
    def passes(seed: int) -> list[list[int]]:
        source = data.ArrayBatches(np.arange(50), None, None, 10, shuffle=True, seed=seed)
        return [np.concatenate([source.batch(p * 5 + i)[0] for i in range(5)]).tolist() for p in range(3)]

    first, second = passes(seed=7), passes(seed=7)
    assert first == second
    assert first[0] != first[1], "each pass is shuffled anew"
    assert all(sorted(p) == list(range(50)) for p in first)


def test_batch_shuffle_keeps_each_batch_whole_and_no_shuffle_keeps_the_order() -> None:
    by_batch = data.ArrayBatches(np.arange(40), None, None, 10, shuffle="batch", seed=1)
    batches = [by_batch.batch(i)[0].tolist() for i in range(4)]
    assert sorted(b[0] for b in batches) == [0, 10, 20, 30]
    assert all(b == list(range(b[0], b[0] + 10)) for b in batches)
    ordered = data.ArrayBatches(np.arange(40), None, None, 10, shuffle=False, seed=1)
    assert ordered.batch(5)[0].tolist() == list(range(10, 20)), "batch 5 is the second of the second pass"


def test_a_short_last_batch_of_arrays_is_left_out() -> None:
    source = data.ArrayBatches(np.arange(25), None, None, 10, shuffle=False, seed=0)
    assert source.batches_per_pass == 2
    assert source.batch(2)[0].tolist() == list(range(10)), "the next pass starts after two batches"


def test_a_dataset_s_batches_are_its_elements_repeated_and_read_back_from_the_start() -> None:
    source = data.DatasetBatches(tf.data.Dataset.range(10).batch(4))  # 4, 4, 2 rows
    assert source.batches_per_pass == 3
    assert source.batch(4)[0].tolist() == [4, 5, 6, 7]
    assert source.batch(1)[0].tolist() == [4, 5, 6, 7], "an earlier batch: walked again from the start"
    counted = data.DatasetBatches(tf.data.Dataset.range(10).filter(lambda v: v < 8).batch(4))
    assert counted.batches_per_pass == 2, "a dataset of unknown length is counted once"
    assert data.DatasetBatches(tf.data.Dataset.range(3).repeat().batch(2)).batches_per_pass is None


def test_a_batch_shorter_than_the_group_still_gives_each_member_a_row() -> None:
    first, second, third = _places([[1.0, 1.0, 1.0]])
    short = (np.arange(2),)
    assert [data.share(short, p)[0].tolist() for p in (first, second, third)] == [[0], [1], [1]]


def test_a_three_times_faster_member_gets_three_times_the_rows() -> None:
    slow, fast = _places([[1.0, 3.0]])
    assert list(slow.rows_per_member(64)) == [16, 48]
    assert fast.stop - fast.start == pytest.approx(3 * (slow.stop - slow.start))


def test_the_dataset_reads_the_share_last_put_in_place_and_reading_consumes_nothing() -> None:
    next_share = data.NextShare([tf.int64])
    next_share.put(data.Share(0, (np.array([1, 2]),)))
    stream = iter(next_share.dataset(tf.TensorSpec((None,), tf.int64), batches_per_pass=None, can_end=False))
    assert next(stream).numpy().tolist() == [1, 2]
    assert next(stream).numpy().tolist() == [1, 2], "an element read (to build a model) takes nothing away"
    next_share.put(data.Share(1, (np.array([3]),)))
    assert next(stream).numpy().tolist() == [3], "a share of another length"


def test_the_train_step_fills_the_next_share_in_a_structure_of_arrays() -> None:
    spec = ({"image": tf.TensorSpec((None, 2), tf.float32)}, tf.TensorSpec((None,), tf.int64))
    next_share = data.NextShare([s.dtype for s in tf.nest.flatten(spec)])
    next_share.put(data.Share(0, (np.zeros((1, 2), np.float32), np.zeros(1, np.int64))))

    @tf.function
    def step() -> None:
        next_share.fill([tf.constant(4, tf.int64), tf.ones((3, 2)), tf.constant([7, 8, 9], tf.int64)])

    step()
    (x, y) = next(iter(next_share.dataset(spec, batches_per_pass=None, can_end=False)))
    assert x["image"].shape == (3, 2) and y.numpy().tolist() == [7, 8, 9]


def test_an_iterator_ends_where_the_next_share_lies_in_a_later_pass_than_its_first() -> None:
    next_share = data.NextShare([tf.int64])
    dataset = next_share.dataset(tf.TensorSpec((None,), tf.int64), batches_per_pass=3, can_end=False)

    def epoch(batches: list[int]) -> list[int]:
        # Each batch is put in place as a step's reply would, after the one before is read.
        read, stream = [], iter(dataset)
        for batch in batches:
            next_share.put(data.Share(batch, (np.array([batch]),)))
            element = next(stream, None)
            if element is None:
                break
            read.extend(element.numpy().tolist())
        return read

    assert epoch([1, 2, 3]) == [1, 2], "batch 3 is the second pass's first"
    assert epoch([3, 4, 5, 6]) == [3, 4, 5], "the next iterator starts at the pass it finds"
    assert epoch([6, 2, 7, 9]) == [6, 2, 7], "a batch of an earlier pass (a restored server) is read"


def test_only_a_source_that_can_end_ends_the_epoch_at_the_end_of_its_data() -> None:
    # Arrays read for `steps_per_epoch` steps make an endless dataset, as a generator does.
    arrays = data.batch_source(np.arange(4, dtype=np.float32), None, None, 2, False, 0)
    generator = data.batch_source((np.full(2, i, np.float32) for i in range(2)), None, None, 2, False, 0)
    assert (arrays.can_end, generator.can_end) == (False, True)
    for source in (arrays, generator):
        next_share = data.NextShare([tf.float32])
        next_share.put(data.Share.end(next_share.array_dtypes))
        stream = iter(next_share.dataset(source.element_spec, batches_per_pass=None, can_end=source.can_end))
        read = [element.numpy().tolist() for element in itertools.islice(stream, 3)]
        assert read == ([] if source.can_end else [[], [], []]), "an end only where the source can end"


def test_the_next_share_is_not_mirrored_inside_a_strategy_s_scope() -> None:
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        next_share = data.NextShare([tf.float32])
    next_share.put(data.Share(0, (np.array([0.5], np.float32),)))
    dataset = next_share.dataset(tf.TensorSpec((None,), tf.float32), batches_per_pass=None, can_end=False)
    assert next(iter(dataset)).numpy().tolist() == [0.5]


def test_the_dataset_reads_nothing_ahead_and_starts_no_tuning_thread_for_an_iterator_s_end_to_wait_for() -> None:
    # With tf.data's autotuning on, deleting a pass's iterator waited for its tuning
    # thread: on a quarter-core emulated host, a worker stopped there for seconds at the
    # end of a pass, and its group with it.
    options = data.NextShare([tf.float64]).dataset(tf.TensorSpec((None,), tf.float64), batches_per_pass=2, can_end=False).options()
    assert options.autotune.enabled is False
    assert options.experimental_optimization.inject_prefetch is False
    assert options.experimental_optimization.apply_default_optimizations is False


def test_validation_split_takes_the_last_rows() -> None:
    x, y = np.arange(10), np.arange(10) * 2
    (xt, yt, sw), (xv, yv) = data.split_validation(x, y, None, 0.3)
    assert list(xt) == list(range(7)) and list(yv) == [14, 16, 18] and sw is None


def test_unsupported_inputs_are_refused() -> None:
    with pytest.raises(TypeError, match="NumPy arrays"):
        data.batch_source({1, 2}, None, None, 2, False, 0)
    with pytest.raises(ValueError, match="yields no batch"):
        data.batch_source(iter([]), None, None, 2, False, 0)
    with pytest.raises(ValueError, match="inside its batches"):
        data.batch_source(tf.data.Dataset.range(3), np.zeros(3), None, 2, False, 0)
    with pytest.raises(ValueError, match="no batch of 8"):
        data.batch_source(np.zeros(5), None, None, 8, False, 0)


def test_a_generator_is_walked_to_each_batch_and_its_end_is_no_more_batches() -> None:
    source = data.batch_source((np.full((2, 1), i, np.float32) for i in range(5)), None, None, 2, False, 0)
    assert source.batch(0)[0][0, 0] == 0 and source.batch(3)[0][0, 0] == 3
    with pytest.raises(ValueError, match="behind the generator"):
        source.batch(1)
    with pytest.raises(data.NoMoreBatches):
        source.batch(5)


class _Items(keras.utils.PyDataset):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ended = 0

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return np.full((2, 1), index, np.float32), np.zeros(2, np.int64)

    def on_epoch_end(self) -> None:
        self.ended += 1


@pytest.mark.parametrize("workers", [1, 3])
def test_a_py_dataset_s_passes_are_shuffled_alike_and_read_ahead_gives_the_same_items(workers: int) -> None:
    items = [_Items(workers=workers), _Items()]
    sources = [data.batch_source(d, None, None, 2, True, 7) for d in items]
    reads = [[int(s.batch(i)[0][0, 0]) for i in range(0, 13, 2)] for s in sources]
    assert reads[0] == reads[1]
    assert sorted(reads[0][:3]) == sorted(set(reads[0][:3]))
    assert items[0].ended == items[1].ended == 2


def test_reads_ahead_that_reach_passes_further_on_leave_the_current_pass_s_order_alone() -> None:
    # A stride of 7 batches (of 6 a pass) reads ahead into the passes two to four on.
    items = [_Items(workers=3), _Items()]
    sources = [data.batch_source(d, None, None, 2, True, 7) for d in items]
    reads = [[int(s.batch(i)[0][0, 0]) for i in (0, 7, 8, 9)] for s in sources]
    assert reads[0] == reads[1]
