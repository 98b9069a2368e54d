"""An update that would make the weights NaN or Inf is refused, and nothing changes."""

import numpy as np
import pytest

from omnikeras.parameter_server.errors import InvalidArgument, NonFinite
from omnikeras.parameter_server.model_state import ModelState
from omnikeras.parameter_server.optimizers import Step
from omnikeras.parameter_server.update_rule import Hyperparameters

LARGEST = np.finfo(np.float32).max
BIG = LARGEST / 2


def _model(weights: dict[str, np.ndarray], **rule: float) -> ModelState:
    model = ModelState(Hyperparameters(**rule))
    model.initialize(weights)
    return model


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_an_update_that_overflows_is_refused_and_changes_nothing(momentum: float) -> None:
    model = _model({"a": np.ones(3, np.float32), "b": np.array([BIG, 1, 1], np.float32)}, learning_rate=1.0, momentum=momentum)
    model.apply({"a": np.ones(3, np.float32), "b": np.zeros(3, np.float32)})
    before = {name: w.copy() for name, w in model.weights.items()}
    slots = {name: {slot: a.copy() for slot, a in state.items()} for name, state in model.slots.items()}

    with pytest.raises(NonFinite, match="'b'"):
        model.apply({"a": np.ones(3, np.float32), "b": np.array([-LARGEST, 0, 0], np.float32)})

    assert model.version == 1 and model.iterations == 1
    for name, weight in model.weights.items():
        np.testing.assert_array_equal(weight, before[name])
    assert model.slots.keys() == slots.keys()
    for name, state in model.slots.items():
        for slot, array in state.items():
            np.testing.assert_array_equal(array, slots[name][slot])


def test_an_update_near_the_limit_that_stays_finite_is_applied_exactly() -> None:
    model = _model({"w": np.array([BIG, -BIG, 0], np.float32)}, learning_rate=1.0)
    model.apply({"w": np.array([BIG / 2, -BIG / 2, 1], np.float32)})
    np.testing.assert_array_equal(model.weights["w"], np.array([BIG / 2, -BIG / 2, -1], np.float32))
    assert model.version == 1


def test_bounds_measured_afresh_let_ordinary_updates_through_after_a_large_one() -> None:
    # The carried bounds grow with every update; the guard then measures the weights and
    # applies the update in place when they are far from the limit.
    model = _model({"w": np.zeros(4, np.float32)}, learning_rate=1.0)
    model.apply({"w": np.full(4, BIG / 8, np.float32)})
    model.apply({"w": np.full(4, -BIG / 8, np.float32)})
    for _ in range(3):
        model.apply({"w": np.ones(4, np.float32)})
    np.testing.assert_array_equal(model.weights["w"], np.full(4, -3, np.float32))


def test_weight_decay_and_nesterov_momentum_are_bounded_too() -> None:
    model = _model({"w": np.full(2, BIG / 2, np.float32)}, learning_rate=1.0, momentum=0.5, settings={"nesterov": 1.0}, weight_decay=0.5)
    model.apply({"w": np.full(2, -BIG / 4, np.float32)})
    assert np.isfinite(model.weights["w"]).all() and np.isfinite(model.slots["w"]["momentum"]).all()
    with pytest.raises(NonFinite):
        model.apply({"w": np.full(2, -LARGEST, np.float32)})
    assert model.version == 1


def test_an_adam_update_that_overflows_its_second_moment_is_refused_and_changes_nothing() -> None:
    model = _model({"w": np.ones(3, np.float32)}, learning_rate=0.1, momentum=0.9, optimizer="Adam")
    model.apply({"w": np.ones(3, np.float32)})
    before = model.weights["w"].copy()
    moments = {slot: array.copy() for slot, array in model.slots["w"].items()}
    assert set(moments) == {"momentum", "velocity"}

    # Finite, but its square is not.
    with pytest.raises(NonFinite, match="'w'"):
        model.apply({"w": np.array([1e30, 0, 0], np.float32)})

    assert model.iterations == 1
    np.testing.assert_array_equal(model.weights["w"], before)
    for slot, array in model.slots["w"].items():
        np.testing.assert_array_equal(array, moments[slot])
    model.apply({"w": np.ones(3, np.float32)})
    assert model.iterations == 2 and (model.weights["w"] < before).all()


def test_another_optimizer_starts_from_fresh_state_and_a_new_learning_rate_keeps_it() -> None:
    model = _model({"w": np.ones(3, np.float32)}, learning_rate=0.1, momentum=0.9)
    model.apply({"w": np.ones(3, np.float32)})
    momentum = model.slots["w"]["momentum"].copy()
    model.hyperparameters = Hyperparameters(0.05, momentum=0.9)
    np.testing.assert_array_equal(model.slots["w"]["momentum"], momentum)
    model.hyperparameters = Hyperparameters(0.01, momentum=0.9, optimizer="Adam")
    model.apply({"w": np.ones(3, np.float32)})
    assert set(model.slots["w"]) == {"momentum", "velocity"}
    # Adam's first moment after its first update: (1 - beta_1) times the gradient.
    np.testing.assert_allclose(model.slots["w"]["momentum"], np.full(3, 0.1), rtol=1e-6)


def test_adam_updates_in_place_while_its_bounds_allow_and_matches_its_update_on_copies() -> None:
    rng = np.random.default_rng(0)
    start = rng.normal(size=(5, 3)).astype(np.float32)
    gradients = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(20)]
    model = _model({"w": start.copy()}, learning_rate=0.01, momentum=0.9, optimizer="Adam", settings={"amsgrad": 1.0})
    model.apply({"w": gradients[0].copy()})
    weight = model.weights["w"]
    for gradient in gradients[1:]:
        model.apply({"w": gradient.copy()})
    # No copy a step: the arrays of the first update hold the result.
    assert model.weights["w"] is weight

    rule = model.hyperparameters.rule
    expected, slots = start.copy(), rule.slots(start, Step(0.01, 0.9, 0))
    for iteration, gradient in enumerate(gradients):
        expected, slots = rule.update(expected, gradient.copy(), slots, Step(0.01, 0.9, iteration))
    np.testing.assert_allclose(model.weights["w"], expected, rtol=1e-6, atol=1e-7)
    for slot, array in slots.items():
        np.testing.assert_allclose(model.slots["w"][slot], array, rtol=1e-6, atol=1e-9)


def test_adam_without_epsilon_is_checked_and_its_zero_over_zero_refused() -> None:
    model = _model({"w": np.ones(3, np.float32)}, learning_rate=0.1, momentum=0.9, optimizer="Adam", settings={"epsilon": 0.0})
    with pytest.raises(NonFinite, match="'w'"):
        model.apply({"w": np.array([1, 0, 1], np.float32)})
    np.testing.assert_array_equal(model.weights["w"], np.ones(3, np.float32))
    assert model.iterations == 0


def test_muon_updates_its_adamw_variables_by_adamw_and_refuses_an_overflow_alike() -> None:
    model = ModelState(Hyperparameters(0.01, momentum=0.95, optimizer="Muon", adamw_variables=frozenset({"b"})))
    model.initialize({"k": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)})
    model.apply({"k": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)})
    # Keras' slots: a momentum for each variable, a velocity for AdamW's only.
    assert set(model.slots["k"]) == {"momentum"} and set(model.slots["b"]) == {"momentum", "velocity"}
    before = {name: w.copy() for name, w in model.weights.items()}

    # Finite, but the AdamW velocity's square is not.
    with pytest.raises(NonFinite, match="'b'"):
        model.apply({"k": np.ones((3, 2), np.float32), "b": np.array([1e30, 0], np.float32)})

    assert model.iterations == 1
    for name, weight in model.weights.items():
        np.testing.assert_array_equal(weight, before[name])
    # Another choice of AdamW variables starts from fresh state, as another optimizer does.
    model.hyperparameters = Hyperparameters(0.01, momentum=0.95, optimizer="Muon", adamw_variables=frozenset("kb"))
    assert model.slots == {}


def test_muon_refuses_a_variable_it_cannot_orthogonalize_outside_its_adamw_variables() -> None:
    model = ModelState(Hyperparameters(0.01, momentum=0.95, optimizer="Muon"))
    with pytest.raises(InvalidArgument, match="orthogonalizes matrices only: b must be among its adamw_variables"):
        model.initialize({"k": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)})
    assert not model.initialized
    model = _model({"k": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)})
    with pytest.raises(InvalidArgument, match="b must be among"):
        model.hyperparameters = Hyperparameters(0.01, momentum=0.95, optimizer="Muon")
    assert model.hyperparameters.optimizer == "SGD"


def test_a_restarted_optimizer_starts_without_state_from_iteration_zero() -> None:
    model = _model({"w": np.ones(3, np.float32)}, learning_rate=0.1, momentum=0.9)
    model.apply({"w": np.ones(3, np.float32)})
    model.apply({"w": np.ones(3, np.float32)})
    # The same optimizer, newly compiled: Keras' new one has neither momentum nor iterations.
    model.restart_optimizer()
    assert (model.slots, model.iterations, model.version) == ({}, 0, 2)
    before = model.weights["w"].copy()
    model.apply({"w": np.ones(3, np.float32)})
    np.testing.assert_allclose(model.weights["w"], before - 0.1, rtol=1e-6)
