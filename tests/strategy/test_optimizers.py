"""Every optimizer the server applies trains a model through the strategy as Keras trains
it: with one worker, a model with batch normalization ends with the weights plain Keras
gives it, schedules and weight decay included, also under loss scaling whose first steps
overflow, and through a second `fit` after the optimizer changed."""

import contextlib
from collections.abc import Callable, Iterator
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


def _model() -> keras.Model:
    """A small model whose weights include batch normalization's moving statistics."""
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(3, activation="softmax", name="output"),
        ]
    )


def _constrained_model() -> keras.Model:
    """The model above with Keras' built-in constraints on its kernels, a bias and
    batch normalization's scale, each of which binds during training."""
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu", kernel_constraint=keras.constraints.MaxNorm(0.6), bias_constraint="non_neg"),
            keras.layers.BatchNormalization(gamma_constraint=keras.constraints.MinMaxNorm(0.5, 2.5, rate=0.5)),
            keras.layers.Dense(3, activation="softmax", name="output", kernel_constraint=keras.constraints.UnitNorm(axis=1)),
        ]
    )


def _trained(
    strategy: omnikeras.GroupedAsyncStrategy | None,
    optimizer: Callable[[], Any],
    model_of: Callable[[], keras.Model] = _model,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The model's weights before and after training."""
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = model_of()
        model.compile(optimizer=optimizer(), loss="sparse_categorical_crossentropy")
        # Built before `fit`: built inside it, ScheduleFreeAdamW's copy of the weights into
        # its z does not take in plain Keras (see `optimizers.schedule_free_adamw`).
        model.optimizer.build(model.trainable_variables)
    first = [keras.ops.convert_to_numpy(w) for w in model.weights]
    model.fit(*_data(), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return first, [keras.ops.convert_to_numpy(w) for w in model.weights]


def _trained_alike(
    config: WorkerConfig, optimizer: Callable[[], Any], model_of: Callable[[], keras.Model] = _model
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Trains the model in plain Keras and through the strategy, checks that both end with
    the same weights, and returns the first weights, plain Keras' last and the strategy's."""
    first, plain = _trained(None, optimizer, model_of)
    _, launched = _trained(omnikeras.GroupedAsyncStrategy(config), optimizer, model_of)
    for expected, got in zip(plain, launched, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    return first, plain, launched


@pytest.mark.parametrize("case", sorted(KERAS_OPTIMIZERS))
def test_the_compiled_optimizer_trains_through_the_server_as_in_plain_keras(server, case: str) -> None:
    # Batch normalization's moving statistics are among the weights compared.
    first, plain, _ = _trained_alike(WorkerConfig((server.address,)), KERAS_OPTIMIZERS[case])
    assert len(plain) == 8
    assert not np.allclose(plain[0], first[0], atol=1e-3), "training changed the weights"


@pytest.mark.parametrize(
    "optimizer",
    [lambda: "adam", lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01))],
    ids=["by name", "loss scaled"],
)
def test_an_optimizer_given_by_name_or_under_loss_scaling_trains_as_in_plain_keras(server, optimizer) -> None:
    _trained_alike(WorkerConfig((server.address,)), optimizer)


@pytest.mark.parametrize(
    "optimizer",
    [lambda: keras.optimizers.SGD(0.2, momentum=0.9), lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1)],
    ids=["SGD", "AdamW"],
)
def test_constrained_variables_train_through_the_server_as_in_plain_keras(server, optimizer) -> None:
    first, plain, _ = _trained_alike(WorkerConfig((server.address,)), optimizer, _constrained_model)
    kernel, bias, gamma, output = plain[0], plain[1], plain[2], plain[6]
    # Each constraint binds: without it, training leaves these outside its bounds.
    assert np.linalg.norm(first[0], axis=0).max() > 0.6 and np.linalg.norm(kernel, axis=0).max() == pytest.approx(0.6, rel=1e-5)
    assert bias.min() == 0.0 and (bias > 0).any()
    assert np.linalg.norm(output, axis=1) == pytest.approx(1.0, rel=1e-5)
    assert 0.5 <= np.linalg.norm(gamma) <= 2.5 and not np.allclose(gamma, first[2])


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, use_ema=True, ema_momentum=0.9),
        lambda: keras.optimizers.Adam(0.02, use_ema=True, ema_overwrite_frequency=5),
    ],
    ids=["SGD", "Adam overwritten every 5 updates"],
)
def test_a_moving_average_of_the_weights_ends_fit_as_in_plain_keras(server, optimizer) -> None:
    first, plain, launched = _trained_alike(WorkerConfig((server.address,)), optimizer)
    assert not np.allclose(plain[0], first[0], atol=1e-3), "training changed the weights"
    # The model ends with the averages, which the server kept.
    model = server.coordinator.model
    kernel = next(name for name, weight in model.weights.items() if weight.shape == (4, 8))
    np.testing.assert_array_equal(model.slots[kernel]["average"], launched[0])


@pytest.mark.parametrize(
    "optimizer, steps",
    [
        (lambda: keras.optimizers.SGD(0.1, momentum=0.9, gradient_accumulation_steps=3), 3),
        (
            lambda: keras.optimizers.AdamW(
                keras.optimizers.schedules.ExponentialDecay(0.05, 4, 0.5), weight_decay=0.05, gradient_accumulation_steps=2, use_ema=True
            ),
            2,
        ),
        (lambda: keras.optimizers.Adam(WarmUpCosine(0.05, 12, 4), gradient_accumulation_steps=2), 2),
        (lambda: keras.optimizers.SGD(0.1, momentum=0.9, gradient_accumulation_steps=3, clipnorm=0.05), 3),
        (lambda: keras.optimizers.Adam(0.05, gradient_accumulation_steps=2, global_clipnorm=0.1), 2),
    ],
    ids=[
        "SGD",
        "AdamW with a schedule and a moving average",
        "Adam with a schedule of its own",
        "SGD clipped by norm",
        "Adam clipped by global norm",
    ],
)
def test_accumulated_gradients_train_through_the_server_as_in_plain_keras(server, optimizer, steps: int) -> None:
    first, plain, _ = _trained_alike(WorkerConfig((server.address,)), optimizer)
    assert not np.allclose(plain[0], first[0], atol=1e-3), "training changed the weights"
    model = server.coordinator.model
    assert (model.iterations, model.updates) == (EPOCHS * EXAMPLES // BATCH, EPOCHS * EXAMPLES // BATCH // steps)


def test_a_global_norm_of_accumulated_gradients_over_shards_is_refused_with_what_to_do(server) -> None:
    other = omnikeras.ParameterServer()
    other.start()
    try:
        strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address, other.address)))
        with strategy.scope():
            model = _model()
            model.compile(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2, global_clipnorm=1.0), "sparse_categorical_crossentropy")
        with pytest.raises(ValueError, match="global_clipnorm .* 2 parameter server shards .* use clipnorm, or one shard"):
            model.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)
    finally:
        other.stop()


def test_a_constraint_of_the_users_own_is_refused_with_what_to_do(server) -> None:
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, kernel_constraint=lambda w: keras.ops.clip(w, -1, 1))])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="constraint .* is not supported.*NonNeg, MaxNorm, UnitNorm, MinMaxNorm"):
        model.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)


class WarmUpCosine(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule of the user's own, as keras-io's examples write one: a linear warm-up,
    then a cosine decay to 0."""

    def __init__(self, base: float, total_steps: int, warmup_steps: int) -> None:
        super().__init__()
        self.base, self.total_steps, self.warmup_steps = base, total_steps, warmup_steps

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        progress = (step - self.warmup_steps) / float(self.total_steps - self.warmup_steps)
        decayed = 0.5 * self.base * (1 + keras.ops.cos(np.pi * progress))
        return keras.ops.where(step < self.warmup_steps, self.base * step / self.warmup_steps, decayed)


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.SGD(WarmUpCosine(0.1, 12, 4), momentum=0.9),
        lambda: keras.optimizers.Adam(lambda: 0.02),
        lambda: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.AdamW(WarmUpCosine(0.02, 12, 4), weight_decay=0.05)
        ),
    ],
    ids=["own schedule", "rate as a function", "own schedule loss scaled"],
)
@pytest.mark.parametrize("shared_memory", [True, False], ids=["shared memory", "gRPC"])
def test_a_rate_only_tensorflow_can_evaluate_trains_as_in_plain_keras(server, optimizer, shared_memory: bool) -> None:
    first, plain, _ = _trained_alike(WorkerConfig((server.address,), shared_memory=shared_memory), optimizer)
    assert not np.allclose(plain[0], first[0], atol=1e-3), "training changed the weights"
    assert server.coordinator.model.iterations == EPOCHS * EXAMPLES // BATCH


def test_an_optimizer_the_server_cannot_apply_is_refused_with_what_to_do(server) -> None:
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=type("MyAdam", (keras.optimizers.Adam,), {})(), loss="sparse_categorical_crossentropy")
    with pytest.raises(TypeError, match="MyAdam is not one of them"):
        model.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)


@contextlib.contextmanager
def _mixed_precision() -> Iterator[None]:
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _trained_loss_scaled(strategy: omnikeras.GroupedAsyncStrategy | None) -> tuple[list[np.ndarray], list[float], int]:
    """The weights after training in mixed precision, the loss scale after each step, and
    the updates the optimizer counted."""
    scales: list[float] = []
    with _mixed_precision():
        keras.utils.set_random_seed(1)
        with strategy.scope() if strategy else contextlib.nullcontext():
            model = _model()
            # Float16's gradients overflow at this scale for the first steps; it grows
            # back every second step that updates.
            optimizer = keras.optimizers.LossScaleOptimizer(
                keras.optimizers.SGD(0.05, momentum=0.9), initial_scale=1e6, dynamic_growth_steps=2
            )
            model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")

        def note_scale(batch: int, logs: dict) -> None:
            scales.append(float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)))

        model.fit(
            *_data(), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
            callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=note_scale)],
        )
    weights = [keras.ops.convert_to_numpy(w) for w in model.weights]
    return weights, scales, int(keras.ops.convert_to_numpy(optimizer.iterations))


def test_steps_whose_loss_scale_overflows_are_skipped_as_in_plain_keras(server) -> None:
    plain, plain_scales, plain_updates = _trained_loss_scaled(None)
    ours, scales, updates = _trained_loss_scaled(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))))
    # Some steps were skipped, and the data moved on past them, as in plain Keras.
    assert 0 < plain_updates < len(plain_scales) == EPOCHS * EXAMPLES // BATCH
    assert (scales, updates) == (plain_scales, plain_updates)
    assert server.coordinator.stats().updates_applied == plain_updates
    # Batch normalization's statistics, which skipped steps change too, among them.
    for expected, got in zip(plain, ours, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _recompiled_with_adam(model: keras.Model) -> None:
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")


def _recompiled_with_the_same_sgd(model: keras.Model) -> None:
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy")


def _learning_rate_changed(model: keras.Model) -> None:
    model.optimizer.learning_rate = 0.2


def _fitted_twice(
    strategy: omnikeras.GroupedAsyncStrategy | None, change: Callable[[keras.Model], None]
) -> list[np.ndarray]:
    """The weights after a fit with SGD, `change` of the model's optimizer, and another fit."""
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = _model()
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy")
    model.fit(*_data(), batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    with strategy.scope() if strategy else contextlib.nullcontext():
        change(model)
    model.fit(*_data(), batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return [keras.ops.convert_to_numpy(w) for w in model.weights]


@pytest.mark.parametrize("change", [_recompiled_with_adam, _recompiled_with_the_same_sgd, _learning_rate_changed])
def test_a_second_fit_trains_with_the_optimizer_as_changed_since_the_first(server, change) -> None:
    # A recompiled optimizer starts afresh (Adam's first steps, SGD's momentum), a changed
    # one keeps its state.
    plain = _fitted_twice(None, change)
    ours = _fitted_twice(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))), change)
    for expected, got in zip(plain, ours, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _model_of_two_dtypes() -> keras.Model:
    """A float64 layer beside float32 ones: the weights come back from the server one
    array each rather than in one array of a single dtype."""
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu", dtype="float64"),
            keras.layers.Dense(3, activation="softmax", name="output"),
        ]
    )


def test_variables_of_two_dtypes_train_through_the_server_as_in_plain_keras(server) -> None:
    first, plain, launched = _trained_alike(
        WorkerConfig((server.address,)), lambda: keras.optimizers.SGD(0.1, momentum=0.9), _model_of_two_dtypes
    )
    assert {w.dtype for w in launched} == {np.dtype("float64"), np.dtype("float32")}
    assert not np.allclose(plain[0], first[0], atol=1e-3), "training changed the weights"
