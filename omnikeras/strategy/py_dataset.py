"""The batches of a `keras.utils.PyDataset`, by index, read ahead in parallel as its
`workers` and `use_multiprocessing` ask."""

import multiprocessing
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras.src.trainers.data_adapters import data_adapter_utils
from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

# The batches whose shapes make the element spec, as Keras takes them.
_BATCHES_FOR_SPEC = data_adapter_utils.NUM_BATCHES_FOR_TENSOR_SPEC

# A child process's copy of the dataset (see `_ProcessReader`).
_dataset_in_child: keras.utils.PyDataset | None = None


class PyDatasetBatches:
    """Batch `i` of a `PyDataset` of `n` batches is item `i % n` of pass `i // n`; a
    finite dataset's passes go through its items in an order shuffled by `(seed, pass)`
    with `shuffle`, as `fit` shuffles them each epoch, the same on every worker. An
    endless one (`num_batches` None) is read in order. Each item is taken as Keras takes
    it: `(x,)`, `(x, y)` or `(x, y, sample_weight)`, with `class_weight` turned into
    sample weights. `on_epoch_end` is called as this worker's reading moves into the next
    pass.

    With `workers` above 1 (threads, or forked processes with `use_multiprocessing`, as
    in Keras) the batches this worker is likely to read next are read ahead: as many as
    `workers`, the same distance apart as its last two reads (its group takes every g-th
    batch when g groups go at the same pace).
    """

    can_end = False
    # Reading moves its passes on (`on_epoch_end`) and its reads ahead.
    reads_freely = False

    def __init__(
        self, dataset: keras.utils.PyDataset, shuffle: bool | str, seed: int, class_weight: Mapping[int, float] | None
    ) -> None:
        self._dataset = dataset
        self._standardize = standardizer(class_weight)
        self.batches_per_pass = dataset.num_batches
        if self.batches_per_pass == 0:
            raise ValueError("the PyDataset has length 0")
        count = _BATCHES_FOR_SPEC if self.batches_per_pass is None else min(_BATCHES_FOR_SPEC, self.batches_per_pass)
        firsts = [self._standardize(dataset[i]) for i in range(count)]
        self.element_spec = data_adapter_utils.get_tensor_spec(firsts)
        self._dtypes = [spec.dtype.as_numpy_dtype for spec in tf.nest.flatten(self.element_spec)]
        self._shuffle = bool(shuffle) and self.batches_per_pass is not None
        self._seed = seed
        self._orders: dict[int, np.ndarray] = {}
        self._pass = 0
        self._last_index = -1
        self._stride = 1
        self._reader = _reader_for(dataset)
        self._ahead: dict[int, futures.Future] = {}

    def batch(self, index: int) -> tuple[np.ndarray, ...]:
        self._end_passes_before(index)
        if index > self._last_index >= 0:
            self._stride = index - self._last_index
        self._last_index = index
        item = self._item(index)
        # This worker reads forward: the orders of passes behind this batch's are done with
        # (reads ahead may have made those of later passes already).
        for done in [number for number in self._orders if number < index // (self.batches_per_pass or 1)]:
            del self._orders[done]
        self._read_ahead(index)
        pending = self._ahead.pop(item, None)
        raw = pending.result() if pending is not None else self._dataset[item]
        arrays = tf.nest.flatten(self._standardize(raw))
        return tuple(np.asarray(a, dtype) for a, dtype in zip(arrays, self._dtypes, strict=True))

    def _end_passes_before(self, index: int) -> None:
        """Calls `on_epoch_end` for each pass that reading batch `index` leaves behind.
        What was read ahead of it is dropped: the dataset may change at a pass's end, and
        forked readers start again from the dataset as it is then, as Keras' do."""
        if self.batches_per_pass is None or index // self.batches_per_pass <= self._pass:
            return
        while self._pass < index // self.batches_per_pass:
            self._dataset.on_epoch_end()
            self._pass += 1
        for pending in self._ahead.values():
            pending.cancel()
        self._ahead.clear()
        if isinstance(self._reader, _ProcessReader):
            self._reader.close()
            self._reader = _reader_for(self._dataset)

    def _item(self, index: int) -> int:
        """The dataset's item that is batch `index`."""
        if self.batches_per_pass is None:
            return index
        number, position = divmod(index, self.batches_per_pass)
        if not self._shuffle:
            return position
        if number not in self._orders:
            self._orders[number] = np.random.default_rng([self._seed, number]).permutation(self.batches_per_pass)
        return int(self._orders[number][position])

    def _read_ahead(self, index: int) -> None:
        if self._reader is None:
            return
        wanted = {self._item(index + k * self._stride) for k in range(1, self._reader.workers + 1)}
        for item in self._ahead.keys() - wanted:
            self._ahead.pop(item).cancel()
        for item in wanted - self._ahead.keys():
            self._ahead[item] = self._reader.submit(item)


def standardizer(class_weight: Mapping[int, float] | None) -> Callable[[Any], Any]:
    """Keras' standardization of a `PyDataset`'s item: a tuple or a list of `(x,)`,
    `(x, y)` or `(x, y, sample_weight)`, a bare NumPy array as `(x,)` or a dict as it is;
    with `class_weight`, `(x, y)` gains the sample weights it makes of `y`. Anything else
    is refused with Keras' `ValueError`."""
    return PyDatasetAdapter(_Unqueued(), class_weight=class_weight)._standardize_batch


class _Unqueued(keras.utils.PyDataset):
    """A stand-in for `PyDatasetAdapter`'s batch standardization, which starts no
    reading threads of its own for it."""

    def __init__(self) -> None:
        super().__init__(workers=1, use_multiprocessing=False)


class _ThreadReader:
    def __init__(self, dataset: keras.utils.PyDataset, workers: int) -> None:
        self.workers = workers
        self._dataset = dataset
        self._pool = futures.ThreadPoolExecutor(workers, thread_name_prefix="omnikeras-py-dataset")

    def submit(self, item: int) -> futures.Future:
        return self._pool.submit(self._dataset.__getitem__, item)


class _ProcessReader:
    """Forked processes, each with the dataset as it was when they started (Keras forks
    its readers too: the dataset need not be picklable, its batches must be)."""

    def __init__(self, dataset: keras.utils.PyDataset, workers: int) -> None:
        self.workers = workers
        self._pool = futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("fork"), initializer=_keep_in_child, initargs=(dataset,)
        )

    def submit(self, item: int) -> futures.Future:
        return self._pool.submit(_read_in_child, item)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _keep_in_child(dataset: keras.utils.PyDataset) -> None:
    global _dataset_in_child
    _dataset_in_child = dataset


def _read_in_child(item: int) -> Any:
    assert _dataset_in_child is not None
    return _dataset_in_child[item]


def _reader_for(dataset: keras.utils.PyDataset) -> _ThreadReader | _ProcessReader | None:
    if dataset.use_multiprocessing and dataset.workers > 0:
        return _ProcessReader(dataset, dataset.workers)
    if dataset.workers > 1:
        return _ThreadReader(dataset, dataset.workers)
    return None
