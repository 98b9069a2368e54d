"""The update over whole buffers (`flat_state`) against the update by variable."""

from typing import Any

import numpy as np
import pytest

from omnikeras.parameter_server.buffer_layout import BufferLayout, FlatArrays
from omnikeras.parameter_server.errors import NonFinite
from omnikeras.parameter_server.model_state import ModelState
from omnikeras.parameter_server.tensors import VariableSpec
from omnikeras.parameter_server.update_rule import Hyperparameters

# A statistic between two layers' variables, as batch normalization's sort by name.
SHAPES = {"a/kernel": (5, 3), "a/bias": (3,), "bn/moving_mean": (3,), "c/kernel": (3, 7), "c/bias": (7,)}
STATISTICS = frozenset({"bn/moving_mean"})
LAYOUT = BufferLayout.of({name: VariableSpec(name, np.dtype("<f4"), shape) for name, shape in SHAPES.items()})

RULES: dict[str, dict[str, Any]] = {
    "sgd": {"momentum": 0.0},
    "sgd with momentum": {"momentum": 0.9},
    "nesterov": {"momentum": 0.9, "settings": {"nesterov": 1.0}},
    "adam": {"momentum": 0.9, "optimizer": "Adam"},
    "adam with amsgrad": {"momentum": 0.9, "optimizer": "Adam", "settings": {"amsgrad": 1.0}},
    "adamw with weight decay": {"momentum": 0.9, "optimizer": "AdamW", "weight_decay": 0.05},
}


def _start(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in SHAPES.items()}


def _gradients(count: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{name: rng.normal(size=shape).astype(np.float32) for name, shape in SHAPES.items()} for _ in range(count)]


def _model(rule: dict[str, Any], by_variable: bool = False) -> ModelState:
    model = ModelState(Hyperparameters(learning_rate=0.05, statistics=STATISTICS, **rule))
    model.initialize(_start())
    if by_variable:
        # The update as it was before the buffers: each variable on its own.
        model._apply_flat = lambda *args: False  # type: ignore[method-assign]
    return model


def _segment(gradients: dict[str, np.ndarray], padding: float = 0.0) -> FlatArrays:
    """The gradients as a worker leaves them in its segment, `padding` between them."""
    arrays = LAYOUT.arrays(np.zeros(LAYOUT.region_bytes, np.uint8))
    assert arrays.region is not None
    arrays.region[LAYOUT.padding] = padding
    for name, gradient in gradients.items():
        np.copyto(arrays[name], gradient)
    return arrays


def _assert_close(model: ModelState, reference: ModelState) -> None:
    for name in SHAPES:
        np.testing.assert_allclose(model.weights[name], reference.weights[name], rtol=2e-6, atol=1e-7)
    assert model.slots.keys() == reference.slots.keys()
    for name, slots in reference.slots.items():
        assert model.slots[name].keys() == slots.keys()
        for slot, array in slots.items():
            np.testing.assert_allclose(model.slots[name][slot], array, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_the_update_over_buffers_follows_the_update_by_variable(rule: dict[str, Any]) -> None:
    model, reference = _model(rule), _model(rule, by_variable=True)
    for index, gradients in enumerate(_gradients(30)):
        if index == 10:
            # A skipped step: the statistics alone take their changes.
            for state in (model, reference):
                state.add_statistics({"bn/moving_mean": np.full(3, 0.5, np.float32)})
        model.apply({name: g.copy() for name, g in gradients.items()})
        reference.apply({name: g.copy() for name, g in gradients.items()})
    _assert_close(model, reference)
    # The statistic took its changes only: no optimizer step, no state.
    changes = sum(gradients["bn/moving_mean"] for gradients in _gradients(30)) + 0.5
    np.testing.assert_allclose(model.weights["bn/moving_mean"], _start()["bn/moving_mean"] + changes, rtol=1e-5)
    assert "bn/moving_mean" not in model.slots
    # Every weight lies in one buffer, laid out as a worker's segment.
    first = model.weights[LAYOUT.specs[0].name].ctypes.data
    for spec, offset in zip(LAYOUT.specs, LAYOUT.offsets):
        assert model.weights[spec.name].ctypes.data - first == offset


@pytest.mark.parametrize("by_variable", [False, True], ids=["over buffers", "by variable"])
def test_the_gradients_magnitudes_given_as_one_sum_give_the_same_update(by_variable: bool) -> None:
    rule = RULES["adam"]
    summed, each = _model(rule, by_variable), _model(rule, by_variable)
    for gradients in _gradients(8):
        magnitudes = {name: float(np.abs(g).sum()) for name, g in gradients.items()}
        summed.apply({name: g.copy() for name, g in gradients.items()}, sum(magnitudes.values()))
        each.apply({name: g.copy() for name, g in gradients.items()}, magnitudes)
    for name in SHAPES:
        np.testing.assert_array_equal(summed.weights[name], each.weights[name])
    assert summed.iterations == each.iterations == 8


def test_momentum_switched_on_midway_starts_from_zero_as_by_variable() -> None:
    model, reference = _model({"momentum": 0.0}), _model({"momentum": 0.0}, by_variable=True)
    for index, gradients in enumerate(_gradients(12)):
        if index == 6:
            for state in (model, reference):
                state.hyperparameters = Hyperparameters(learning_rate=0.05, momentum=0.9, statistics=STATISTICS)
        model.apply({name: g.copy() for name, g in gradients.items()})
        reference.apply({name: g.copy() for name, g in gradients.items()})
    assert set(model.slots["a/kernel"]) == {"momentum"}
    _assert_close(model, reference)


@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_gradients_in_a_segment_and_in_arrays_of_their_own_give_the_same_bits(rule: dict[str, Any]) -> None:
    from_segment, from_arrays = _model(rule), _model(rule)
    for gradients in _gradients(10):
        # What a worker leaves between its variables is not theirs: it reaches no weight.
        segment = _segment(gradients, padding=np.nan)
        from_segment.apply(segment.copy())
        assert segment.region is not None and not np.isnan(segment.region).any()
        from_arrays.apply({name: g.copy() for name, g in gradients.items()})
    for name in SHAPES:
        np.testing.assert_array_equal(from_segment.weights[name], from_arrays.weights[name])
        for slot, array in from_arrays.slots.get(name, {}).items():
            np.testing.assert_array_equal(from_segment.slots[name][slot], array)


def test_a_restored_state_is_taken_into_the_buffers_and_goes_on_as_by_variable() -> None:
    rule = RULES["adam"]
    model, reference = _model(rule), _model(rule, by_variable=True)
    gradients = _gradients(10)
    for state in (model, reference):
        for step in gradients[:5]:
            state.apply({name: g.copy() for name, g in step.items()})
        weights, slots = state.snapshot()
        state.apply({name: g * 100 for name, g in gradients[9].items()})
        state.initialize(weights, version=5, slots=slots)
        for step in gradients[5:]:
            state.apply({name: g.copy() for name, g in step.items()})
    _assert_close(model, reference)


def test_a_rule_that_differs_between_variables_updates_by_variable() -> None:
    # Biases left out of the weight decay: each variable's rule is its own.
    rule = {
        "momentum": 0.9,
        "optimizer": "AdamW",
        "weight_decay": 0.05,
        "no_weight_decay": frozenset({"a/bias", "c/bias"}),
    }
    model, reference = _model(rule), _model(rule, by_variable=True)
    for gradients in _gradients(5):
        model.apply(_segment(gradients))
        reference.apply({name: g.copy() for name, g in gradients.items()})
    for name in SHAPES:
        np.testing.assert_array_equal(model.weights[name], reference.weights[name])


def test_an_overflow_over_the_buffers_is_refused_and_changes_nothing() -> None:
    model = _model(RULES["adam"])
    model.apply(_segment(_gradients(1)[0]))
    before = {name: w.copy() for name, w in model.weights.items()}
    gradients = {name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()}
    # Finite, but the second moment's square is not.
    gradients["c/kernel"][0, 0] = 1e30
    with pytest.raises(NonFinite, match="'c/kernel'"):
        model.apply(_segment(gradients))
    for name, weight in before.items():
        np.testing.assert_array_equal(model.weights[name], weight)
    assert model.iterations == 1


def test_weights_go_into_a_segment_in_one_pass_or_by_name() -> None:
    model = _model(RULES["sgd with momentum"])
    model.apply(_segment(_gradients(1)[0]))
    out = LAYOUT.arrays(np.full(LAYOUT.region_bytes, 0xFF, np.uint8))
    model.copy_weights_into(out)
    for name in SHAPES:
        np.testing.assert_array_equal(out[name], model.weights[name])
    assert out.region is not None and not np.isnan(out.region).any()

    # A mapping whose arrays are not all the buffer's takes each by name.
    elsewhere = np.zeros(SHAPES["c/bias"], np.float32)
    out["c/bias"] = elsewhere
    model.copy_weights_into(out)
    np.testing.assert_array_equal(elsewhere, model.weights["c/bias"])
