"""Every optimizer the server applies trains a model through the strategy as Keras trains
it: with one worker, a model with batch normalization ends with the weights plain Keras
gives it, schedules and weight decay included."""

import contextlib
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
from optimizer_cases import KERAS_OPTIMIZERS

import omnikeras
from omnikeras import WorkerConfig

BATCH, EXAMPLES, EPOCHS = 16, 96, 2


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 4)).astype(np.float32)
    return x, ((x[:, 0] > 0) + (x[:, 1] > 1)).astype(np.int64)


def _trained(
    strategy: omnikeras.GroupedAsyncStrategy | None, optimizer: Callable[[], Any]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The model's weights before and after training."""
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.Dense(3, activation="softmax", name="output"),
            ]
        )
        model.compile(optimizer=optimizer(), loss="sparse_categorical_crossentropy")
        # Built before `fit`: built inside it, ScheduleFreeAdamW's copy of the weights into
        # its z does not take in plain Keras (see `optimizers.schedule_free_adamw`).
        model.optimizer.build(model.trainable_variables)
    first = [keras.ops.convert_to_numpy(w) for w in model.weights]
    model.fit(*_data(), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return first, [keras.ops.convert_to_numpy(w) for w in model.weights]


@pytest.mark.parametrize("case", sorted(KERAS_OPTIMIZERS))
def test_the_compiled_optimizer_trains_through_the_server_as_in_plain_keras(server, case: str) -> None:
    first, plain = _trained(None, KERAS_OPTIMIZERS[case])
    _, launched = _trained(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))), KERAS_OPTIMIZERS[case])
    # Batch normalization's moving statistics are among the weights compared.
    assert len(plain) == 8
    for expected, got in zip(plain, launched, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(plain[0], first[0], atol=1e-3), "training changed the weights"


@pytest.mark.parametrize(
    "optimizer",
    [lambda: "adam", lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01))],
    ids=["by name", "loss scaled"],
)
def test_an_optimizer_given_by_name_or_under_loss_scaling_trains_as_in_plain_keras(server, optimizer) -> None:
    _, plain = _trained(None, optimizer)
    _, launched = _trained(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))), optimizer)
    for expected, got in zip(plain, launched, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_an_optimizer_the_server_cannot_apply_is_refused_with_what_to_do(server) -> None:
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=type("MyAdam", (keras.optimizers.Adam,), {})(), loss="sparse_categorical_crossentropy")
    with pytest.raises(TypeError, match="MyAdam is not one of them"):
        model.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)
