"""The weights the exchange hands the train step: one array of the held variables' layout."""

import mmap

import numpy as np

from omnikeras.parameter_server.buffer_layout import BufferLayout
from omnikeras.parameter_server.shared_memory import SegmentLayout
from omnikeras.parameter_server.tensors import VariableSpec
from omnikeras.strategy.worker import packed

SHAPES = {"dense/kernel": (4, 3), "dense/bias": (3,), "output/kernel": (3, 2)}
SPECS = {name: VariableSpec(name, np.dtype("<f4"), shape) for name, shape in SHAPES.items()}


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in SHAPES.items()}


def _unpacked(array: np.ndarray, layout: BufferLayout) -> dict[str, np.ndarray]:
    return {name: array[layout.span_of(name)].reshape(shape) for name, shape in SHAPES.items()}


def test_weights_in_a_segment_go_out_as_its_buffer_without_a_copy() -> None:
    layout = SegmentLayout.of(SPECS)
    _, in_segment = layout.views(mmap.mmap(-1, layout.segment_bytes))
    for name, weight in _weights().items():
        np.copyto(in_segment[name], weight)
    held = BufferLayout.of(SPECS)

    array = packed(in_segment, held)

    assert in_segment.region is not None
    assert array.ctypes.data == in_segment.region.ctypes.data and array.size == held.elements
    for name, weight in _unpacked(array, held).items():
        np.testing.assert_array_equal(weight, _weights()[name])


def test_weights_of_their_own_are_copied_into_one_array_of_the_layout() -> None:
    held = BufferLayout.of(SPECS)
    weights = _weights()

    array = packed(weights, held)

    assert not any(np.shares_memory(array, weight) for weight in weights.values())
    for name, weight in _unpacked(array, held).items():
        np.testing.assert_array_equal(weight, weights[name])


def test_a_segment_of_other_variables_is_copied_by_name() -> None:
    # The segment of a shard that holds more variables than the train step assigns.
    layout = SegmentLayout.of({**SPECS, "extra/kernel": VariableSpec("extra/kernel", np.dtype("<f4"), (5,))})
    _, in_segment = layout.views(mmap.mmap(-1, layout.segment_bytes))
    for name, weight in _weights().items():
        np.copyto(in_segment[name], weight)
    held = BufferLayout.of(SPECS)

    array = packed(in_segment, held)

    assert array.size == held.elements
    for name, weight in _unpacked(array, held).items():
        np.testing.assert_array_equal(weight, _weights()[name])
