"""Each worker's distinct part of the training data.

All workers walk the same sequence of batches (the same seeded shuffle). Group `j` of `g`
takes batches `j, j + g, j + 2g, ...`, one per group step, and each member of the group
takes its slice of the batch's rows, so every example is read once per epoch and each
update is made of exactly one batch.
"""

from typing import Any

import numpy as np
import tensorflow as tf

from omnikeras.strategy.worker import GroupPlace


def training_batches(
    x: Any,
    y: Any,
    sample_weight: Any,
    batch_size: int | None,
    shuffle: bool | str,
    seed: int,
    drop_remainder: bool,
) -> tf.data.Dataset:
    """The batches `model.fit` would make of `x`, the same on every worker."""
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
    return dataset.batch(batch_size or 32, drop_remainder=drop_remainder)


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


def worker_shard(batches: tf.data.Dataset, place: GroupPlace) -> tf.data.Dataset:
    """This worker's share of `batches`: its group's batches, and its rows of each."""
    batches = batches.shard(place.num_groups, place.group)
    if len(place.members) > 1:
        static_size = tf.nest.flatten(batches.element_spec)[0].shape[0]
        if static_size is None:
            batches = batches.filter(lambda *batch: _every_member_gets_rows(batch, place))
        elif rows_per_member(static_size, place).min() < 1:
            raise ValueError(
                f"a batch of {static_size} cannot be shared by the {len(place.members)} "
                "members of a group: raise the batch size"
            )
        batches = batches.map(lambda *batch: _rows(batch, place))
    return batches.prefetch(tf.data.AUTOTUNE)


def rows_per_member(batch_size: int, place: GroupPlace) -> np.ndarray:
    """How many rows of a batch of `batch_size` each member of the group takes."""
    return np.diff(np.round(batch_size * np.array(place.boundaries)).astype(int))


def _bounds(batch: tuple, place: GroupPlace) -> tf.Tensor:
    count = tf.cast(tf.shape(tf.nest.flatten(batch)[0])[0], tf.float64)
    return tf.cast(tf.math.round(count * tf.constant(place.boundaries, tf.float64)), tf.int32)


def _every_member_gets_rows(batch: tuple, place: GroupPlace) -> tf.Tensor:
    # Decided alike by every member, so that they all take the same number of steps.
    bounds = _bounds(batch, place)
    return tf.reduce_all(bounds[1:] > bounds[:-1])


def _rows(batch: tuple, place: GroupPlace) -> Any:
    bounds = _bounds(batch, place)
    start, stop = bounds[place.member_index], bounds[place.member_index + 1]
    sliced = tf.nest.map_structure(lambda tensor: tensor[start:stop], batch)
    return sliced[0] if len(sliced) == 1 else sliced


def _is_array_structure(x: Any) -> bool:
    return all(isinstance(leaf, (np.ndarray, tf.Tensor)) for leaf in tf.nest.flatten(x))
