"""The batches by index and each worker's share: together the workers read each example
once per pass, however the server hands the batches out."""

import collections

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


@pytest.mark.parametrize(
    ("groups", "parts"),
    [
        ([[1.0], [1.0]], [0.5, 0.5]),
        ([[1.0, 1.0, 1.0], [1.0, 1.0]], [0.6, 0.4]),
        ([[1.0], [0.25], [0.25], [0.25], [0.25]], [0.5, 0.125, 0.125, 0.125, 0.125]),
    ],
)
def test_a_group_reads_its_members_part_of_the_cluster_s_throughput(groups: list[list[float]], parts: list[float]) -> None:
    throughputs = [t for members in groups for t in members]
    workers = range(1, len(throughputs) + 1)
    places = _places(groups)
    by_group = {p.group: p.part_of_batches(lambda w: throughputs[w - 1], workers) for p in places}
    assert [by_group[g] for g in range(len(groups))] == pytest.approx(parts)


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


class _Shares:
    """Stands in for the worker: the share its next step reads, or None past the epoch."""

    def __init__(self, share: data.Share | None) -> None:
        self.share = share

    def __call__(self) -> data.Share | None:
        return self.share


def test_the_feed_gives_the_share_last_chosen_and_reading_consumes_nothing() -> None:
    shares = _Shares(data.Share(0, (np.array([1, 2]),)))
    feed = iter(data.ShareFeed(tf.TensorSpec((None,), tf.int64), shares, tf.distribute.get_strategy()))
    assert next(feed).numpy().tolist() == [1, 2]
    assert next(feed).numpy().tolist() == [1, 2], "an element read (to build a model) takes nothing away"
    shares.share = data.Share(1, (np.array([3]),))
    assert next(feed).numpy().tolist() == [3], "a share of another length"
    shares.share = None
    with pytest.raises(StopIteration):
        next(feed)


def test_the_feed_gives_a_share_in_the_structure_of_the_batches() -> None:
    spec = ({"image": tf.TensorSpec((None, 2), tf.float32)}, tf.TensorSpec((None,), tf.int64))
    shares = _Shares(data.Share(4, (np.ones((3, 2), np.float32), np.array([7, 8, 9]))))
    (x, y) = next(data.ShareFeed(spec, shares, tf.distribute.get_strategy()))
    assert x["image"].shape == (3, 2) and x["image"].dtype == tf.float32 and y.numpy().tolist() == [7, 8, 9]


@pytest.mark.parametrize(
    "structure",
    [lambda x, y: (x, y), lambda x, y: (x,), lambda x, y: x, lambda x, y: collections.namedtuple("Batch", "x y")(x, y)],
    ids=["pair", "one-tuple", "bare", "namedtuple"],
)
def test_the_feed_keeps_flat_structures_as_they_are(structure) -> None:
    spec = structure(tf.TensorSpec((None, 2), tf.float32), tf.TensorSpec((None,), tf.int64))
    arrays = (np.ones((3, 2), np.float32), np.array([7, 8, 9]))[: len(tf.nest.flatten(spec))]
    element = next(data.ShareFeed(spec, _Shares(data.Share(0, arrays)), tf.distribute.get_strategy()))
    assert type(element) is type(spec) if tf.nest.is_nested(spec) else isinstance(element, tf.Tensor)
    for tensor, array in zip(tf.nest.flatten(element), arrays, strict=True):
        np.testing.assert_array_equal(tensor.numpy(), array)


def test_the_dataset_fit_is_given_has_the_batches_structure_and_nothing_to_read() -> None:
    spec = ({"image": tf.TensorSpec((None, None, 2), tf.float32)}, tf.TensorSpec((None,), tf.int64))
    stand_in = data.stand_in(spec)
    assert stand_in.element_spec == spec
    assert list(stand_in) == []


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


def test_a_prepared_share_is_read_as_prepared_and_any_other_share_as_it_comes() -> None:
    prepared = data.Share(1, (np.array([1, 2]),))
    shares = _Shares(prepared)
    feed = data.ShareFeed(tf.TensorSpec((None,), tf.int64), shares, tf.distribute.get_strategy())
    feed.prepare(prepared)
    first = next(feed)
    assert first is next(feed), "the tensors made ahead"
    assert first.numpy().tolist() == [1, 2]
    # Equal rows, but not the share prepared: read as it comes.
    shares.share = data.Share(1, (np.array([3, 4]),))
    assert next(feed).numpy().tolist() == [3, 4]


def test_only_arrays_are_read_freely() -> None:
    # The others' reading moves them on: a stream's position, a PyDataset's passes.
    x = np.zeros((8, 2), np.float32)
    assert data.batch_source(x, np.zeros(8), None, 4, True, 0).reads_freely
    dataset = tf.data.Dataset.from_tensor_slices((x, np.zeros(8))).batch(4)
    assert not data.batch_source(dataset, None, None, 4, True, 0).reads_freely
    assert not data.batch_source(iter([(x[:4], np.zeros(4))] * 3), None, None, 4, True, 0).reads_freely
    assert not data.batch_source(_Items(), None, None, 2, True, 0).reads_freely
