"""Keras' `use_ema` and `gradient_accumulation_steps` on the server: each weight's moving
average follows it as Keras' optimizer moves it, the weights take their averages every
`ema_overwrite_frequency` updates and when a training ends (unless the chief set the final
weights), the weights are updated every so many steps with the mean of their gradients, clipped as Keras
clips it,
and the averages and accumulated gradients are optimizer state like any other."""

import keras
import numpy as np
import pytest

from omnikeras.parameter_server.checkpoints import CheckpointDirectory
from omnikeras.parameter_server.clipping import Clipping
from omnikeras.parameter_server.errors import InvalidArgument
from omnikeras.parameter_server.groups import GroupCoordinator
from omnikeras.parameter_server.model_state import ModelState
from omnikeras.parameter_server.update_rule import Hyperparameters

UPDATES = 7


def _gradients() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(UPDATES)]


def _keras(optimizer: keras.optimizers.Optimizer, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keras' weight and its average after the updates."""
    variable = keras.Variable(start)
    for gradient in _gradients():
        optimizer.apply([keras.ops.convert_to_tensor(gradient)], [variable])
    average = optimizer._model_variables_moving_average[0]
    return keras.ops.convert_to_numpy(variable), keras.ops.convert_to_numpy(average)


@pytest.mark.parametrize("frequency", [None, 3])
@pytest.mark.parametrize("optimizer", ["SGD", "Adagrad"], ids=["updated in place", "updated on copies"])
def test_the_average_and_its_overwrites_follow_keras(optimizer: str, frequency: int | None) -> None:
    start = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    keras_optimizer = getattr(keras.optimizers, optimizer)(0.1, use_ema=True, ema_momentum=0.8, ema_overwrite_frequency=frequency)
    expected_weight, expected_average = _keras(keras_optimizer, start)

    model = ModelState(Hyperparameters(0.1, optimizer=optimizer, ema_momentum=0.8, ema_overwrite_frequency=frequency or 0))
    model.initialize({"w": start.copy()})
    for gradient in _gradients():
        model.apply({"w": gradient.copy()})
    np.testing.assert_allclose(model.slots["w"]["average"], expected_average, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(model.weights["w"], expected_weight, rtol=1e-6, atol=1e-7)
    if frequency:
        # Overwritten at update 6: the weight moved once since.
        assert not np.allclose(model.weights["w"], model.slots["w"]["average"])


@pytest.mark.parametrize("use_ema", [False, True], ids=["", "with a moving average"])
@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "Adagrad"])
def test_accumulated_gradients_update_the_weights_as_keras_does(optimizer: str, use_ema: bool) -> None:
    start = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    keras_optimizer = getattr(keras.optimizers, optimizer)(0.1, gradient_accumulation_steps=3, use_ema=use_ema, ema_overwrite_frequency=5 if use_ema else None)
    variable = keras.Variable(start)
    for gradient in _gradients():
        keras_optimizer.apply([keras.ops.convert_to_tensor(gradient)], [variable])

    # Adam's beta_1 is its momentum-like setting.
    momentum = 0.9 if optimizer == "Adam" else 0.0
    rule = Hyperparameters(0.1, momentum, optimizer=optimizer, gradient_accumulation_steps=3, ema_momentum=0.99 if use_ema else None, ema_overwrite_frequency=5 if use_ema else 0)
    model = ModelState(rule)
    model.initialize({"w": start.copy()})
    versions = []
    for gradient in _gradients():
        model.apply({"w": gradient.copy()})
        versions.append(model.version)
    np.testing.assert_allclose(model.weights["w"], keras.ops.convert_to_numpy(variable), rtol=1e-6, atol=1e-7)
    assert model.iterations == UPDATES
    # Updated at steps 3 and 6; the seventh gradient waits in the accumulator.
    np.testing.assert_array_equal(model.slots["w"]["gradient_accumulator"], _gradients()[-1])
    if not use_ema:
        assert versions == [0, 0, 1, 1, 1, 2, 2]


def test_a_statistic_takes_its_change_at_every_step_of_an_accumulation() -> None:
    model = ModelState(Hyperparameters(0.1, gradient_accumulation_steps=2, statistics=frozenset({"mean"})))
    model.initialize({"w": np.zeros(2, np.float32), "mean": np.zeros(2, np.float32)})
    model.apply({"w": np.ones(2, np.float32), "mean": np.full(2, 0.5, np.float32)})
    np.testing.assert_array_equal(model.weights["mean"], np.full(2, 0.5, np.float32))
    np.testing.assert_array_equal(model.weights["w"], np.zeros(2, np.float32))
    model.apply({"w": np.full(2, 3.0, np.float32), "mean": np.full(2, 0.5, np.float32)})
    np.testing.assert_array_equal(model.weights["mean"], np.ones(2, np.float32))
    # The mean of the two gradients, 2, at a rate of 0.1.
    np.testing.assert_allclose(model.weights["w"], np.full(2, -0.2, np.float32))
    assert "gradient_accumulator" not in model.slots["w"]


def test_finalizing_puts_the_averages_in_place_as_keras_does_when_fit_ends() -> None:
    start = np.zeros((2, 3), np.float32)
    keras_optimizer = keras.optimizers.SGD(0.1, use_ema=True)
    variable = keras.Variable(start)
    for gradient in _gradients():
        keras_optimizer.apply([keras.ops.convert_to_tensor(gradient)], [variable])
    keras_optimizer.finalize_variable_values([variable])

    model = ModelState(Hyperparameters(0.1, ema_momentum=0.99))
    model.initialize({"w": start.copy()})
    for gradient in _gradients():
        model.apply({"w": gradient.copy()})
    version = model.version
    model.finalize_averages()
    np.testing.assert_allclose(model.weights["w"], keras.ops.convert_to_numpy(variable), rtol=1e-6, atol=1e-7)
    assert model.version == version + 1


def test_without_use_ema_no_average_is_kept_and_finalizing_changes_nothing() -> None:
    model = ModelState(Hyperparameters(0.1, momentum=0.9))
    model.initialize({"w": np.zeros(3, np.float32)})
    model.apply({"w": np.ones(3, np.float32)})
    weight, version = model.weights["w"].copy(), model.version
    model.finalize_averages()
    assert set(model.slots["w"]) == {"momentum"}
    np.testing.assert_array_equal(model.weights["w"], weight)
    assert model.version == version


def _coordinator_after_a_training(chosen: np.ndarray | None) -> GroupCoordinator:
    rule = Hyperparameters(1.0, ema_momentum=0.5)
    coordinator = GroupCoordinator(ModelState(rule))
    coordinator.initialize({"w": np.zeros(3, np.float32)}, rule)
    worker = coordinator.register()[0]
    for step, value in enumerate([-1.0, -3.0], start=1):
        coordinator.push(worker, step, coordinator.model.version, 1, {"w": np.full(3, value, np.float32)})
    coordinator.request_stop()
    if chosen is not None:
        coordinator.set_weights({"w": chosen})
    coordinator.deregister(worker)
    return coordinator


def test_a_training_ends_with_the_averages_or_with_the_weights_the_chief_set() -> None:
    # Weights 1, then 4; averages 1, then 0.5 * 1 + 0.5 * 4.
    averaged = _coordinator_after_a_training(None)
    np.testing.assert_array_equal(averaged.model.weights["w"], np.full(3, 2.5, np.float32))
    chosen = _coordinator_after_a_training(np.full(3, 7.0, np.float32))
    np.testing.assert_array_equal(chosen.model.weights["w"], np.full(3, 7.0, np.float32))


def test_the_averages_survive_a_checkpoint_and_the_rule_the_wire(tmp_path) -> None:
    rule = Hyperparameters(0.1, ema_momentum=0.9, ema_overwrite_frequency=4)
    assert Hyperparameters.from_proto(rule.to_proto()) == rule
    coordinator = GroupCoordinator(ModelState(rule))
    coordinator.initialize({"w": np.zeros(3, np.float32)}, rule)
    worker = coordinator.register()[0]
    for step in range(1, 4):
        coordinator.push(worker, step, coordinator.model.version, 1, {"w": np.full(3, float(step), np.float32)})
    checkpoints = CheckpointDirectory(tmp_path)
    restored = checkpoints.load(checkpoints.save(coordinator.checkpoint_state()))
    assert restored.hyperparameters == rule
    np.testing.assert_array_equal(restored.slots["w"]["average"], coordinator.model.slots["w"]["average"])


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"ema_momentum": 1.5}, "ema_momentum must lie in"),
        ({"ema_momentum": float("nan")}, "ema_momentum must lie in"),
        ({"ema_overwrite_frequency": 5}, "positive with an ema_momentum"),
        ({"ema_momentum": 0.9, "ema_overwrite_frequency": -1}, "ema_overwrite_frequency must be"),
        ({"gradient_accumulation_steps": 1}, "gradient_accumulation_steps must be 0 or 2 or more"),
    ],
)
def test_a_malformed_moving_average_is_refused(settings: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Hyperparameters(**settings)


@pytest.mark.parametrize(
    "clipping",
    [{"clipnorm": 0.5}, {"global_clipnorm": 0.7}, {"clipvalue": 0.2}],
    ids=["clipnorm", "global_clipnorm", "clipvalue"],
)
def test_the_accumulated_mean_is_clipped_as_keras_clips_it(clipping: dict) -> None:
    start = {"w": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}
    gradients = [(g, g[0] * 3) for g in _gradients()]
    keras_optimizer = keras.optimizers.Adam(0.1, gradient_accumulation_steps=2, **clipping)
    variables = [keras.Variable(start["w"]), keras.Variable(start["b"])]
    for gradient, bias in gradients:
        keras_optimizer.apply([keras.ops.convert_to_tensor(gradient), keras.ops.convert_to_tensor(bias)], variables)

    model = ModelState(Hyperparameters(0.1, 0.9, optimizer="Adam", gradient_accumulation_steps=2, clipping=Clipping(**clipping)))
    model.initialize({name: weight.copy() for name, weight in start.items()})
    for gradient, bias in gradients:
        model.apply({"w": gradient.copy(), "b": bias.copy()})
    for name, variable in zip(["w", "b"], variables):
        np.testing.assert_allclose(model.weights[name], keras.ops.convert_to_numpy(variable), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "settings, message",
    [({"clipnorm": -1.0}, "clipnorm must be finite"), ({"clipnorm": 1.0, "clipvalue": 0.5}, "only one of")],
)
def test_malformed_clipping_is_refused(settings: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Clipping(**settings)
