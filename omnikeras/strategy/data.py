"""The training batches, by index, and each worker's share of them.

The parameter server hands out batch indices, one per group step, in one sequence shared by
all groups (`PushResult.next_batch`): batch `i` is position `i % n` of pass `i // n` over
the data, and every worker reads the same batch `i` (the same seeded shuffle), so every
example is read once per pass however the groups are laid out, also across a regrouping.
Each member of a group takes its slice of the batch's rows. A worker chooses its share of
the next batch as each step's reply names it, inside the step, and `fit` hands the next
step that share (`ShareFeed`).
"""

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import keras
import numpy as np
import tensorflow as tf
from keras.src.trainers.data_adapters import data_adapter_utils
from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn

from omnikeras.strategy.place import GroupPlace
from omnikeras.strategy.py_dataset import PyDatasetBatches, standardizer

# The batches whose shapes make a generator's element spec, as Keras takes them.
_BATCHES_FOR_SPEC = data_adapter_utils.NUM_BATCHES_FOR_TENSOR_SPEC


class BatchSource(Protocol):
    """The training batches, each readable by its index."""

    element_spec: Any

    @property
    def batches_per_pass(self) -> int | None:
        """Batches in one pass over the data; None for an endless dataset."""

    @property
    def can_end(self) -> bool:
        """Whether the batches can run out (a generator's): `batch` then raises
        `NoMoreBatches`, and the epoch ends there."""

    @property
    def reads_freely(self) -> bool:
        """Whether any batch may be read at any time, with nothing changed by reading it
        (arrays): a worker then reads the batch its next step is likely to take ahead of
        the reply that names it."""

    def batch(self, index: int) -> tuple[np.ndarray, ...]:
        """Batch `index` as NumPy arrays, flattened in the order of `element_spec`'s
        structure (what `tf.nest.flatten` gives)."""


class ArrayBatches:
    """The batches `model.fit` makes of arrays: pass `p` reads them in an order shuffled
    by `(seed, p)`, the same on every worker. A short last batch is left out: it could not
    be shared by every member of a group."""

    can_end = False
    reads_freely = True

    def __init__(self, x: Any, y: Any, sample_weight: Any, batch_size: int, shuffle: bool | str, seed: int) -> None:
        if not _is_array_structure(x):
            raise TypeError(
                "GroupedAsyncStrategy reads NumPy arrays, tensors, a batched tf.data.Dataset, "
                f"a keras.utils.PyDataset or a generator; got {type(x).__name__}"
            )
        parts = tuple(part for part in (x, y, sample_weight) if part is not None)
        elements = tf.nest.map_structure(np.asarray, parts if len(parts) > 1 else parts[0])
        # Flat once: a structure walked at every step costs more than the rows it picks.
        self._arrays = tuple(tf.nest.flatten(elements))
        self.example_count = len(self._arrays[0])
        self.batch_size = batch_size
        self.batches_per_pass = self.example_count // batch_size
        if self.batches_per_pass == 0:
            raise ValueError(f"{self.example_count} examples make no batch of {batch_size}")
        self.element_spec = tf.nest.map_structure(lambda a: tf.TensorSpec((None, *a.shape[1:]), a.dtype), elements)
        self._shuffle = shuffle
        self._seed = seed
        self._order_of_pass = (-1, np.arange(0))

    def batch(self, index: int) -> tuple[np.ndarray, ...]:
        number, position = divmod(index, self.batches_per_pass)
        rows = self._order(number)[position * self.batch_size : (position + 1) * self.batch_size]
        return tuple(a[rows] for a in self._arrays)

    def _order(self, number: int) -> np.ndarray:
        if self._order_of_pass[0] != number:
            self._order_of_pass = (number, self._shuffled(number))
        return self._order_of_pass[1]

    def _shuffled(self, number: int) -> np.ndarray:
        if not self._shuffle:
            return np.arange(self.example_count)
        random = np.random.default_rng([self._seed, number])
        if self._shuffle == "batch":
            # Keras' "batch" shuffle: the batches in a new order, each batch as it is.
            batches = random.permutation(self.batches_per_pass)
            return (batches[:, None] * self.batch_size + np.arange(self.batch_size)).ravel()
        return random.permutation(self.example_count)


class DatasetBatches:
    """The batches of a batched `tf.data.Dataset`: batch `i` is element `i` of the dataset
    repeated, so every worker walks the same passes (a seeded shuffle inside the dataset
    shuffles each pass alike on every worker)."""

    can_end = False
    reads_freely = False

    def __init__(self, dataset: tf.data.Dataset) -> None:
        cardinality = int(dataset.cardinality())
        if cardinality == tf.data.UNKNOWN_CARDINALITY:
            # One pass to count: the batch indices need the length of a pass.
            cardinality = sum(1 for _ in dataset)
        if cardinality == 0:
            raise ValueError("the training dataset is empty")
        self.batches_per_pass = None if cardinality == tf.data.INFINITE_CARDINALITY else cardinality
        self.element_spec = dataset.element_spec
        self._dataset = dataset
        self._stream: Iterator[Any] | None = None
        self._position = 0

    def batch(self, index: int) -> tuple[np.ndarray, ...]:
        if self._stream is None or index < self._position:
            # Back to an earlier batch (after a server restart): walk again from the start.
            self._stream, self._position = iter(self._dataset.repeat()), 0
        while self._position < index:
            next(self._stream)
            self._position += 1
        self._position += 1
        return tuple(np.asarray(a) for a in tf.nest.flatten(next(self._stream)))


class NoMoreBatches(Exception):
    """A source that ends (a generator) has no batch of the index asked for."""


class GeneratorBatches:
    """The batches a Python generator (or any iterator) yields, in order: batch `i` is its
    `i`-th item. Every worker runs the same script, so each reads its own copy of the
    same batches: each walks to the batches its group reads and skips the others', and
    across the workers every batch is read once. A generator's length is unknown until
    it ends, and its end ends the epoch, as in Keras; it cannot be read again from an
    earlier batch (after a parameter server's restart): a `keras.utils.PyDataset` can.
    """

    batches_per_pass = None
    can_end = True
    reads_freely = False

    def __init__(self, generator: Iterator[Any]) -> None:
        self._stream = iter(generator)
        self._standardize = _standardizer()
        firsts = [self._standardize(batch) for batch in itertools.islice(self._stream, _BATCHES_FOR_SPEC)]
        if not firsts:
            raise ValueError("the generator yields no batch")
        self.element_spec = data_adapter_utils.get_tensor_spec(firsts)
        self._dtypes = [spec.dtype.as_numpy_dtype for spec in tf.nest.flatten(self.element_spec)]
        self._stream = itertools.chain(firsts, self._stream)
        self._position = 0

    def batch(self, index: int) -> tuple[np.ndarray, ...]:
        if index < self._position:
            raise ValueError(
                f"batch {index} is behind the generator, which has yielded {self._position}: a generator "
                "cannot be read again after the parameter server restarted; pass a keras.utils.PyDataset"
            )
        try:
            while self._position < index:
                next(self._stream)
                self._position += 1
            batch = self._standardize(next(self._stream))
        except StopIteration:
            raise NoMoreBatches(f"the generator ended after {self._position} batches") from None
        self._position += 1
        return tuple(np.asarray(a, dtype) for a, dtype in zip(tf.nest.flatten(batch), self._dtypes, strict=True))


def _standardizer() -> Callable[[Any], Any]:
    """Keras' standardization of a batch (`standardizer`), with no class weights, taking
    any bare tensor as `(x,)`: Keras takes a generator's or a dataset's so, where a
    PyDataset's standardization takes only a bare NumPy array."""
    standardize = standardizer(class_weight=None)
    return lambda batch: standardize(batch if tf.nest.is_nested(batch) else (batch,))


def batch_source(
    x: Any,
    y: Any,
    sample_weight: Any,
    batch_size: int,
    shuffle: bool | str,
    seed: int,
    class_weight: Mapping[int, float] | None = None,
) -> BatchSource:
    """The batches `model.fit` would make of its arguments, with `class_weight` turned
    into sample weights as Keras turns it."""
    if isinstance(x, tf.data.Dataset):
        _no_y_or_sample_weight(y, sample_weight, "a tf.data.Dataset")
        if class_weight is not None:
            x = x.map(make_class_weight_map_fn(class_weight))
        return DatasetBatches(x)
    if isinstance(x, keras.utils.PyDataset):
        _no_y_or_sample_weight(y, sample_weight, "a PyDataset")
        return PyDatasetBatches(x, shuffle, seed, class_weight)
    if isinstance(x, Iterator):
        _no_y_or_sample_weight(y, sample_weight, "a generator")
        if class_weight is not None:
            raise ValueError(
                "class_weight is not supported for Python generator inputs, as in Keras: "
                "yield (x, y, sample_weight) batches, or pass a keras.utils.PyDataset"
            )
        return GeneratorBatches(x)
    if class_weight is not None:
        if sample_weight is not None:
            raise ValueError("You cannot `class_weight` and `sample_weight` at the same time.")
        if tf.nest.is_nested(y):
            raise ValueError("`class_weight` is only supported for Models with a single output.")
        sample_weight = data_adapter_utils.class_weight_to_sample_weights(y, class_weight)
    return ArrayBatches(x, y, sample_weight, batch_size, shuffle, seed)


def _no_y_or_sample_weight(y: Any, sample_weight: Any, kind: str) -> None:
    if y is not None or sample_weight is not None:
        raise ValueError(f"with {kind}, pass y and sample_weight inside its batches")


def share(batch: tuple[np.ndarray, ...], place: GroupPlace) -> tuple[np.ndarray, ...]:
    """A member's rows of its group's batch (flat arrays, as `BatchSource.batch` gives
    them): at least one, also of a batch shorter than the group (a dataset's last), where
    the members without a row of their own take the last one."""
    count = len(batch[0])
    start = min(round(count * place.start), count - 1)
    stop = max(round(count * place.stop), start + 1)
    if (start, stop) == (0, count):
        return batch
    return tuple(a[start:stop] for a in batch)


@dataclasses.dataclass(frozen=True)
class Share:
    """A worker's rows of one batch: the batch's index and the rows' arrays, flattened in
    the order of the batch's structure."""

    batch: int
    arrays: tuple[np.ndarray, ...]

    @property
    def rows(self) -> int:
        return len(self.arrays[0]) if self.arrays else 0

    @classmethod
    def end(cls) -> "Share":
        """The share after a source's last batch: no batch, no rows."""
        return cls(-1, ())


def share_of(source: BatchSource, batch: int, place: GroupPlace) -> Share:
    """The rows of batch `batch` that `place` takes."""
    return Share(batch, share(source.batch(batch), place))


class ShareFeed:
    """What `fit`'s train step reads: at each `next`, the share the exchange of the step
    before chose (the reply named the batch), as tensors in the structure of the batches;
    with several local replicas, a `PerReplica` of each replica's rows. It ends where
    `next_share` gives None (the epoch is over).

    So no dataset's iterator reads ahead: tf.data's, or a distributed one (which
    prefetches), would read a share before the exchange that chooses it, and its
    `get_next` cost the step more than Keras' prefetched one. The worker may hand over
    the share it expects the next step to read while the servers work on this one
    (`prepare`), so that its tensors are made off the step's path. Reading is
    idempotent: the element Keras takes to build the model consumes nothing.

    Args:
        element_spec: The batches' structure.
        next_share: The share the next step reads, or None where the epoch is over.
        strategy: The strategy whose replicas the rows are divided among.
    """

    def __init__(
        self, element_spec: Any, next_share: Callable[[], Share | None], strategy: tf.distribute.Strategy
    ) -> None:
        self.element_spec = element_spec
        self._next_share = next_share
        self._strategy = strategy
        self._prepared: tuple[Share, Any] | None = None
        # The usual structures, `(x, y)` and a bare `x`, take their tensors as they are:
        # `tf.nest.pack_sequence_as` cost 50 to 75 us a step in the step's Python.
        self._flat = type(element_spec) is tuple and not any(tf.nest.is_nested(spec) for spec in element_spec)
        self._bare = not tf.nest.is_nested(element_spec)

    def __iter__(self) -> "ShareFeed":
        return self

    def __next__(self) -> Any:
        share = self._next_share()
        if share is None:
            raise StopIteration
        replicas = self._strategy.num_replicas_in_sync
        if replicas == 1:
            if self._prepared is not None and self._prepared[0] is share:
                return self._prepared[1]
            return self._tensors(share.arrays)
        parts = [np.array_split(array, replicas) for array in share.arrays]

        def rows(context: tf.distribute.experimental.ValueContext) -> Any:
            return self._tensors(tuple(part[context.replica_id_in_sync_group] for part in parts))

        return self._strategy.experimental_distribute_values_from_function(rows)

    def prepare(self, share: Share) -> None:
        """Makes the tensors of `share` now, for the `next` that reads this very share
        (with one local replica; with several, they are made as it is read)."""
        if self._strategy.num_replicas_in_sync == 1:
            self._prepared = (share, self._tensors(share.arrays))

    def _tensors(self, arrays: tuple[np.ndarray, ...]) -> Any:
        tensors = [tf.convert_to_tensor(a) for a in arrays]
        if self._flat:
            return tuple(tensors)
        if self._bare:
            return tensors[0]
        return tf.nest.pack_sequence_as(self.element_spec, tensors)


def stand_in(element_spec: Any) -> tf.data.Dataset:
    """The dataset `fit` is given in place of the shares, for its structure only: the
    strategy puts a `ShareFeed` in its place (`experimental_distribute_dataset`). Read
    as a dataset, it is empty."""
    return tf.data.Dataset.from_generator(lambda: iter(()), output_signature=element_spec)


def first_examples(x: Any, y: Any, sample_weight: Any, count: int) -> tuple[Any, Any, Any]:
    """The first `count` examples of `fit`'s data, in their order: the first rows of
    arrays, or of a batched dataset's or a PyDataset's first batches. The same every
    time: a fixed probe."""
    if isinstance(x, Iterator):
        raise TypeError(
            "a generator's first examples cannot be read again: pass a keras.utils.PyDataset or arrays"
        )
    if isinstance(x, (tf.data.Dataset, keras.utils.PyDataset)):
        standardize, batches, rows = _standardizer(), [], 0
        for batch in x if isinstance(x, tf.data.Dataset) else (x[i] for i in _items(x)):
            batch = standardize(batch)
            batches.append(tf.nest.map_structure(np.asarray, batch))
            rows += len(tf.nest.flatten(batch)[0])
            if rows >= count:
                break
        joined = tf.nest.map_structure(lambda *parts: np.concatenate(parts)[:count], *batches)
        return keras.utils.unpack_x_y_sample_weight(joined)

    def head(arrays: Any) -> Any:
        return None if arrays is None else tf.nest.map_structure(lambda a: a[:count], arrays)

    return head(x), head(y), head(sample_weight)


def _items(dataset: keras.utils.PyDataset) -> Iterator[int]:
    return itertools.count() if dataset.num_batches is None else iter(range(dataset.num_batches))


def example_count(x: Any) -> int | None:
    """Examples in `fit`'s data; None for a dataset, a PyDataset or a generator, whose
    batches are counted, not their examples."""
    if isinstance(x, (tf.data.Dataset, keras.utils.PyDataset, Iterator)):
        return None
    return len(tf.nest.flatten(x)[0])


def split_validation(x: Any, y: Any, sample_weight: Any, fraction: float) -> tuple[tuple, tuple]:
    """Splits off the last `fraction` of the arrays, as Keras' `validation_split` does."""
    if not _is_array_structure(x):
        raise ValueError(
            f"validation_split needs arrays, as in Keras; with {type(x).__name__}, pass validation_data"
        )
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


def _is_array_structure(x: Any) -> bool:
    return all(isinstance(leaf, (np.ndarray, tf.Tensor)) for leaf in tf.nest.flatten(x))
