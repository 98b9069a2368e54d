"""Every input `fit` takes trains through the strategy as it trains in plain Keras: with
one worker, the same batches in the same order give the same weights."""

import contextlib

import keras
import numpy as np
import pytest

import omnikeras
from omnikeras import ParameterServer, WorkerConfig

BATCH, EXAMPLES = 16, 96


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 4)).astype(np.float32)
    return x, ((x[:, 0] > 0) + (x[:, 1] > 1)).astype(np.int64)


class Batches(keras.utils.PyDataset):
    """The arrays in batches of `BATCH`, in order; counts `on_epoch_end`."""

    def __init__(self, x: np.ndarray, y: np.ndarray, **kwargs) -> None:
        super().__init__(**kwargs)
        self.x, self.y = x, y
        self.epochs_ended = 0

    def __len__(self) -> int:
        return len(self.x) // BATCH

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rows = slice(index * BATCH, (index + 1) * BATCH)
        return self.x[rows], self.y[rows]

    def on_epoch_end(self) -> None:
        self.epochs_ended += 1


def _batches(x: np.ndarray, y: np.ndarray, passes: int):
    for _ in range(passes):
        for start in range(0, len(x), BATCH):
            yield x[start : start + BATCH], y[start : start + BATCH]


def _weights(strategy: omnikeras.GroupedAsyncStrategy | None, fit) -> list[np.ndarray]:
    """The weights after `fit(model)`, with the same first weights every time."""
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.3, momentum=0.5), loss="sparse_categorical_crossentropy")
    fit(model)
    return [keras.ops.convert_to_numpy(w) for w in model.trainable_variables]


def _same_as_plain_keras(server: ParameterServer, fit) -> None:
    plain = _weights(None, fit)
    launched = _weights(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))), fit)
    for expected, got in zip(plain, launched, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(plain[0], _weights(None, lambda model: None)[0]), "training changed the weights"


def test_class_weight_gives_the_weights_plain_keras_gives(server) -> None:
    x, y = _data()
    class_weight = {0: 0.5, 1: 2.0, 2: 4.0}
    _same_as_plain_keras(
        server, lambda model: model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, class_weight=class_weight, verbose=0)
    )


@pytest.mark.parametrize("readers", [{}, {"workers": 3}, {"workers": 2, "use_multiprocessing": True}])
def test_a_py_dataset_gives_the_weights_plain_keras_gives(server, readers: dict) -> None:
    x, y = _data()
    _same_as_plain_keras(
        server, lambda model: model.fit(Batches(x, y, **readers), epochs=2, shuffle=False, verbose=0)
    )


def test_a_py_dataset_with_class_weight_gives_the_weights_plain_keras_gives(server) -> None:
    x, y = _data()
    class_weight = {0: 0.5, 1: 2.0, 2: 4.0}
    _same_as_plain_keras(
        server, lambda model: model.fit(Batches(x, y), epochs=2, shuffle=False, class_weight=class_weight, verbose=0)
    )


def test_a_py_dataset_s_epochs_end_as_its_passes_do(server) -> None:
    x, y = _data()
    dataset = Batches(x, y)
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    _weights(strategy, lambda model: model.fit(dataset, epochs=3, verbose=0))
    # Reading the third pass's first batch ended the first two passes.
    assert dataset.epochs_ended >= 2


def test_a_generator_gives_the_weights_plain_keras_gives(server) -> None:
    x, y = _data()
    _same_as_plain_keras(server, lambda model: model.fit(_batches(x, y, 3), epochs=3, steps_per_epoch=4, verbose=0))


def test_a_generator_s_end_ends_the_epoch(server) -> None:
    x, y = _data()
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    _weights(strategy, lambda model: model.fit(_batches(x, y, 1), epochs=1, verbose=0))
    assert strategy.worker.last_push.model_version == EXAMPLES // BATCH


class ValidationBatches(keras.callbacks.Callback):
    """Counts the validation's batches and keeps each epoch's validation loss."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.losses: list[float] = []

    def on_test_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.count += 1

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.losses.append((logs or {})["val_loss"])


def _validate(strategy: omnikeras.GroupedAsyncStrategy | None, validation_batch_size: int | None) -> ValidationBatches:
    x, y = _data()
    counter = ValidationBatches()
    _weights(
        strategy,
        lambda model: model.fit(
            x, y, batch_size=BATCH, epochs=2, shuffle=False, validation_data=(x[:40], y[:40]),
            validation_batch_size=validation_batch_size, callbacks=[counter], verbose=0,
        ),
    )
    return counter


@pytest.mark.parametrize("validation_batch_size", [None, 8])
def test_validation_runs_as_in_plain_keras(server, validation_batch_size: int | None) -> None:
    plain = _validate(None, validation_batch_size)
    # 40 rows: the last batch of each validation is short.
    assert plain.count == 2 * -(-40 // (validation_batch_size or BATCH))
    launched = _validate(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))), validation_batch_size)
    assert launched.count == plain.count
    np.testing.assert_allclose(launched.losses, plain.losses, rtol=1e-5)
    assert plain.losses[1] < plain.losses[0], "the validation loss follows the training"


def test_inputs_keras_refuses_are_refused_with_its_reason(server) -> None:
    x, y = _data()
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.3), loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="class_weight.*sample_weight"):
        model.fit(x, y, sample_weight=np.ones(EXAMPLES), class_weight={0: 1.0}, verbose=0)
    with pytest.raises(ValueError, match="not supported for Python generator"):
        model.fit(_batches(x, y, 1), class_weight={0: 1.0}, verbose=0)
    with pytest.raises(ValueError, match="inside its batches"):
        model.fit(Batches(x, y), y, verbose=0)
    with pytest.raises(ValueError, match="validation_split needs arrays"):
        model.fit(Batches(x, y), validation_split=0.2, verbose=0)
