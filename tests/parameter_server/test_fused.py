"""Adam's compiled one-pass update (`optimizers.fused`) against Keras' arithmetic."""

import numpy as np
import pytest

from omnikeras.parameter_server import parallel
from omnikeras.parameter_server.optimizers import Adam, Step, fused


def _steps(shape: tuple[int, ...], dtype: str, count: int = 6) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    start = rng.normal(size=shape).astype(dtype)
    return start, [rng.normal(size=shape).astype(dtype) * 0.1 for _ in range(count)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_in_one_pass_follows_keras(dtype: str, amsgrad: bool) -> None:
    keras = pytest.importorskip("keras")
    start, gradients = _steps((4, 5), dtype)
    variable = keras.Variable(start.copy())
    reference = keras.optimizers.Adam(learning_rate=0.01, amsgrad=amsgrad)
    adam = Adam({"amsgrad": float(amsgrad)})
    weight = start.copy()
    slots = adam.slots(weight, Step(0.01, 0.9, 0))
    for iteration, gradient in enumerate(gradients):
        reference.apply_gradients([(keras.ops.convert_to_tensor(gradient), variable)])
        adam.update_in_place(weight, gradient.copy(), slots, Step(0.01, 0.9, iteration))
    np.testing.assert_allclose(weight, keras.ops.convert_to_numpy(variable), rtol=1e-6, atol=1e-7)
    assert weight.dtype == np.dtype(dtype)


def test_adam_on_arrays_the_loops_do_not_take_follows_the_same_update() -> None:
    start, gradients = _steps((6, 4), "float32")
    # Every other column: not contiguous, updated through NumPy instead.
    strided = np.repeat(start, 2, axis=1)[:, ::2]
    assert not fused.applies(strided) and np.array_equal(strided, start)
    adam = Adam({})
    weight = start.copy()
    slots, strided_slots = adam.slots(weight, Step(0.01, 0.9, 0)), adam.slots(weight, Step(0.01, 0.9, 0))
    for iteration, gradient in enumerate(gradients):
        adam.update_in_place(weight, gradient.copy(), slots, Step(0.01, 0.9, iteration))
        adam.update_in_place(strided, gradient.copy(), strided_slots, Step(0.01, 0.9, iteration))
    np.testing.assert_allclose(strided, weight, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_large_arrays_split_over_two_threads_get_the_same_adam_update(amsgrad: bool) -> None:
    rng = np.random.default_rng(0)
    size = parallel.SPLIT_ELEMENTS + 3
    start, gradient = rng.normal(size=size).astype(np.float32), rng.normal(size=size).astype(np.float32)
    adam, step = Adam({"amsgrad": float(amsgrad)}), Step(0.01, 0.9, 3)

    def started() -> dict[str, np.ndarray]:
        slots = adam.slots(start, step)
        for array in slots.values():
            array[:] = 0.25
        return slots

    split_weight, split_slots = start.copy(), started()
    adam.update_in_place(split_weight, gradient.copy(), split_slots, step)
    slots = started()
    # The same update, one small piece at a time: below the split threshold.
    for piece in np.array_split(np.arange(size), 8):
        weight = start[piece]
        pieces = {name: array[piece] for name, array in slots.items()}
        adam.update_in_place(weight, gradient[piece].copy(), pieces, step)
        np.testing.assert_array_equal(split_weight[piece], weight)
        for name, array in pieces.items():
            np.testing.assert_array_equal(split_slots[name][piece], array)
