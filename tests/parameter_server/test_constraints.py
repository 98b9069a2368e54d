"""Keras' built-in weight constraints, applied by the server as Keras applies them: after
each update, with its formulas, and under the server's guard against NaN and Inf."""

import keras
import numpy as np
import pytest

from omnikeras.parameter_server.constraints import Constraint
from omnikeras.parameter_server.errors import InvalidArgument, NonFinite
from omnikeras.parameter_server.model_state import ModelState
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.v1 import parameter_server_pb2 as pb

KERAS_CONSTRAINTS = [
    keras.constraints.NonNeg(),
    keras.constraints.MaxNorm(0.5),
    keras.constraints.MaxNorm(2.0, axis=1),
    keras.constraints.MaxNorm(1.0, axis=[0, 1]),
    keras.constraints.MaxNorm(1.0, axis=None),
    keras.constraints.UnitNorm(),
    keras.constraints.UnitNorm(axis=-1),
    keras.constraints.MinMaxNorm(1.0, 1.5),
    keras.constraints.MinMaxNorm(0.2, 0.8, rate=0.5, axis=1),
]


def _server_constraint(keras_constraint: keras.constraints.Constraint) -> Constraint:
    config = keras_constraint.get_config()
    if not isinstance(keras_constraint, keras.constraints.NonNeg):
        config["epsilon"] = keras.backend.epsilon()
    return Constraint(type(keras_constraint).__name__, config)


@pytest.mark.parametrize("keras_constraint", KERAS_CONSTRAINTS, ids=repr)
def test_each_constraint_computes_what_keras_computes(keras_constraint: keras.constraints.Constraint) -> None:
    weight = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)
    expected = keras.ops.convert_to_numpy(keras_constraint(weight))
    constrained = weight.copy()
    _server_constraint(keras_constraint).apply(constrained)
    assert constrained.dtype == np.float32
    np.testing.assert_allclose(constrained, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("keras_constraint", KERAS_CONSTRAINTS, ids=repr)
def test_the_bound_after_a_constraint_holds(keras_constraint: keras.constraints.Constraint) -> None:
    constraint = _server_constraint(keras_constraint)
    for scale in (1e-3, 1.0, 30.0):
        weight = np.random.default_rng(1).normal(scale=scale, size=(3, 4, 5)).astype(np.float32)
        bound = float(np.abs(weight).max())
        constraint.apply(weight)
        assert float(np.abs(weight).max()) <= constraint.bound_after(bound) * (1 + 1e-6)


def test_a_constraint_survives_the_wire() -> None:
    rule = Hyperparameters(constraints={"w": Constraint("MinMaxNorm", {"min_value": 0.1, "max_value": 1, "rate": 0.5, "axis": [0, 1], "epsilon": 1e-7})})
    assert Hyperparameters.from_proto(rule.to_proto()).constraints == rule.constraints


@pytest.mark.parametrize(
    "name, config, message",
    [
        ("Clip", {}, "not one of Keras' built-in constraints"),
        ("MaxNorm", {"axis": 0}, "missing: \\['max_value'\\]"),
        ("NonNeg", {"axis": 0}, "unknown: \\['axis'\\]"),
        ("MaxNorm", {"max_value": float("nan"), "axis": 0}, "max_value must be a finite number"),
        ("MaxNorm", {"max_value": -1.0, "axis": 0}, "max_value must be a finite number, 0 or more"),
        ("UnitNorm", {"axis": "rows"}, "axis must be an integer"),
        ("MinMaxNorm", {"min_value": 2.0, "max_value": 1.0, "rate": 1.0, "axis": 0}, "min_value 2.0 exceeds"),
        ("MinMaxNorm", {"min_value": 0.0, "max_value": 1.0, "rate": 1.5, "axis": 0}, "rate must lie in"),
        ("UnitNorm", {"axis": 0, "epsilon": "small"}, "epsilon must be a finite number"),
    ],
)
def test_a_malformed_constraint_is_refused(name: str, config: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Constraint(name, config)


def test_a_constraint_along_an_axis_its_variable_lacks_is_refused_with_nothing_changed() -> None:
    model = ModelState(Hyperparameters())
    model.initialize({"w": np.ones((2, 3), np.float32)})
    with pytest.raises(InvalidArgument, match="axis \\[2\\]"):
        model.hyperparameters = Hyperparameters(constraints={"w": Constraint("UnitNorm", {"axis": 2})})
    assert model.hyperparameters.constraints == {}


@pytest.mark.parametrize("optimizer", ["SGD", "Adagrad"], ids=["updated in place", "updated on copies"])
def test_the_server_constrains_a_variable_after_its_update_and_leaves_the_others(optimizer: str) -> None:
    rule = Hyperparameters(learning_rate=0.5, optimizer=optimizer, constraints={"w": Constraint("MaxNorm", {"max_value": 1.0, "axis": 0})})
    model = ModelState(rule)
    model.initialize({"w": np.full((2, 2), 0.6, np.float32), "b": np.zeros(2, np.float32)})
    gradients = {"w": np.full((2, 2), -1.0, np.float32), "b": np.full(2, -1.0, np.float32)}
    expected = {}
    for name, gradient in gradients.items():
        unconstrained = ModelState(Hyperparameters(learning_rate=0.5, optimizer=optimizer))
        unconstrained.initialize({name: model.weights[name].copy()})
        unconstrained.apply({name: gradient.copy()})
        expected[name] = unconstrained.weights[name]
    model.apply(gradients)
    norms = np.linalg.norm(model.weights["w"], axis=0)
    np.testing.assert_allclose(norms, 1.0, rtol=1e-6)
    # The direction is the update's, only shortened.
    np.testing.assert_allclose(model.weights["w"], expected["w"] / np.linalg.norm(expected["w"], axis=0), rtol=1e-6)
    np.testing.assert_array_equal(model.weights["b"], expected["b"])


def test_a_constraint_whose_norms_overflow_is_refused_and_changes_nothing() -> None:
    # The squares of 1e20 overflow float32: MinMaxNorm's norms are Inf and its weight NaN.
    rule = Hyperparameters(learning_rate=1.0, constraints={"w": Constraint("MinMaxNorm", {"min_value": 0, "max_value": 1, "rate": 1, "axis": 0})})
    model = ModelState(rule)
    model.initialize({"w": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)})
    model.apply({"w": np.full(3, -0.1, np.float32), "b": np.ones(3, np.float32)})
    before = {name: weight.copy() for name, weight in model.weights.items()}
    with pytest.raises(NonFinite, match="'w'"):
        model.apply({"w": np.full(3, -1e20, np.float32), "b": np.ones(3, np.float32)})
    assert model.iterations == 1
    for name, weight in model.weights.items():
        np.testing.assert_array_equal(weight, before[name])


@pytest.mark.parametrize("config_json, message", [("{", "is not JSON"), ("[0]", "must be a JSON object")])
def test_a_constraint_whose_configuration_is_no_json_object_is_refused(config_json: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=f"constraint configuration {message}"):
        Constraint.from_proto(pb.Constraint(name="MaxNorm", config_json=config_json))
