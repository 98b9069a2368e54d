"""Each worker's distinct part of the training data.

All workers walk the same sequence of batches (the same seeded shuffle). Group `j` of `g`
takes batches `j, j + g, j + 2g, ...`, one per group step, and each member of the group
takes its slice of the batch's rows, so every example is read once per epoch and each
update is made of exactly one batch. The place is read from variables at every batch, so
that a regrouping while training runs takes effect at once, without a new pipeline.
"""

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from omnikeras.strategy.place import GroupPlace


class DataPlacement:
    """The worker's place as variables its input pipeline reads at every batch."""

    def __init__(self) -> None:
        with tf.device("/cpu:0"):
            self.num_groups = tf.Variable(1, dtype=tf.int64, trainable=False)
            self.group = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.start = tf.Variable(0.0, dtype=tf.float64, trainable=False)
            self.stop = tf.Variable(1.0, dtype=tf.float64, trainable=False)
            self.min_rows = tf.Variable(1, dtype=tf.int64, trainable=False)

    def update(self, place: GroupPlace) -> None:
        self.num_groups.assign(place.num_groups)
        self.group.assign(place.group)
        self.start.assign(place.start)
        self.stop.assign(place.stop)
        self.min_rows.assign(place.min_batch_size())


def training_batches(
    x: Any, y: Any, sample_weight: Any, batch_size: int, shuffle: bool | str, seed: int
) -> tf.data.Dataset:
    """The batches `model.fit` would make of `x`, the same on every worker. A short last
    batch is left out: it could not be shared by every member of a group."""
    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError("with a tf.data.Dataset, pass y and sample_weight inside the dataset")
        return x
    if not _is_array_structure(x):
        raise TypeError(
            "GroupedAsyncStrategy reads NumPy arrays, tensors or a batched tf.data.Dataset; "
            f"got {type(x).__name__}"
        )
    elements = tuple(part for part in (x, y, sample_weight) if part is not None)
    dataset = tf.data.Dataset.from_tensor_slices(elements if len(elements) > 1 else elements[0])
    if shuffle:
        count = len(tf.nest.flatten(x)[0])
        # The same seed on every worker: they must agree on which examples form a batch.
        dataset = dataset.shuffle(count, seed=seed, reshuffle_each_iteration=True)
    return dataset.batch(batch_size, drop_remainder=True)


def first_examples(x: Any, y: Any, sample_weight: Any, count: int) -> tuple[Any, Any, Any]:
    """The first `count` examples of `fit`'s data, in their order: the first rows of
    arrays, or of a batched dataset's first batches. The same every time: a fixed probe."""
    if isinstance(x, tf.data.Dataset):
        batches, rows = [], 0
        for batch in x:
            batches.append(tf.nest.map_structure(np.asarray, batch))
            rows += len(tf.nest.flatten(batch)[0])
            if rows >= count:
                break
        joined = tf.nest.map_structure(lambda *parts: np.concatenate(parts)[:count], *batches)
        return keras.utils.unpack_x_y_sample_weight(joined)

    def head(arrays: Any) -> Any:
        return None if arrays is None else tf.nest.map_structure(lambda a: a[:count], arrays)

    return head(x), head(y), head(sample_weight)


def example_count(x: Any) -> int | None:
    """Examples in `fit`'s data; None for a dataset of unknown length."""
    if isinstance(x, tf.data.Dataset):
        return None
    return len(tf.nest.flatten(x)[0])


def split_validation(x: Any, y: Any, sample_weight: Any, fraction: float) -> tuple[tuple, tuple]:
    """Splits off the last `fraction` of the arrays, as Keras' `validation_split` does."""
    if isinstance(x, tf.data.Dataset):
        raise ValueError("validation_split needs arrays; pass validation_data with a dataset")
    if not 0 < fraction < 1:
        raise ValueError(f"validation_split must be in (0, 1), got {fraction}")
    count = len(tf.nest.flatten(x)[0])
    split_at = int(count * (1 - fraction))

    def part(arrays: Any, rows: slice) -> Any:
        return None if arrays is None else tf.nest.map_structure(lambda a: a[rows], arrays)

    head, tail = slice(None, split_at), slice(split_at, None)
    training = (part(x, head), part(y, head), part(sample_weight, head))
    validation = tuple(p for p in (part(x, tail), part(y, tail), part(sample_weight, tail)) if p is not None)
    return training, validation


def worker_shard(batches: tf.data.Dataset, placement: DataPlacement) -> tf.data.Dataset:
    """This worker's share of `batches`: its group's batches, and its rows of each."""

    def mine(index: tf.Tensor, batch: Any) -> tf.Tensor:
        return (index % placement.num_groups == placement.group) & (_length(batch) >= placement.min_rows)

    def rows(index: tf.Tensor, batch: Any) -> Any:
        count = tf.cast(_length(batch), tf.float64)
        start = tf.cast(tf.math.round(count * placement.start), tf.int32)
        stop = tf.cast(tf.math.round(count * placement.stop), tf.int32)
        return tf.nest.map_structure(lambda tensor: tensor[start:stop], batch)

    # One batch ahead at most: a regrouping reaches the next step, not one far behind it.
    return batches.enumerate().filter(mine).map(rows).prefetch(1)


def _length(batch: Any) -> tf.Tensor:
    return tf.cast(tf.shape(tf.nest.flatten(batch)[0])[0], tf.int64)


def _is_array_structure(x: Any) -> bool:
    return all(isinstance(leaf, (np.ndarray, tf.Tensor)) for leaf in tf.nest.flatten(x))
