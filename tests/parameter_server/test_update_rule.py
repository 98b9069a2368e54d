import numpy as np
import pytest

from omnikeras.parameter_server import parallel
from omnikeras.parameter_server.update_rule import Hyperparameters, apply_update


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.9, False), (0.9, True), (0.5, True)])
def test_matches_keras_sgd(momentum: float, nesterov: bool, dtype: str) -> None:
    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(0)
    start = rng.normal(size=(3, 5)).astype(dtype)
    gradients = [rng.normal(size=(3, 5)).astype(dtype) for _ in range(4)]

    variable = keras.Variable(start.copy())
    optimizer = keras.optimizers.SGD(learning_rate=0.1, momentum=momentum, nesterov=nesterov)
    for gradient in gradients:
        optimizer.apply_gradients([(keras.ops.convert_to_tensor(gradient), variable)])

    weight = start.copy()
    velocity = np.zeros_like(weight) if momentum else None
    for gradient in gradients:
        apply_update(weight, velocity, gradient.copy(), Hyperparameters(0.1, momentum, nesterov))

    tolerance = 1e-2 if dtype == "float16" else 1e-6
    np.testing.assert_allclose(weight, keras.ops.convert_to_numpy(variable), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"momentum": 1.0}, "momentum"),
        ({"momentum": float("inf")}, "momentum"),
    ],
)
def test_bad_hyperparameters_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Hyperparameters(**kwargs)


@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_large_arrays_split_over_two_threads_get_the_same_update(momentum: float, nesterov: bool) -> None:
    rng = np.random.default_rng(0)
    size = parallel.SPLIT_ELEMENTS + 3
    start, gradient = rng.normal(size=size).astype(np.float32), rng.normal(size=size).astype(np.float32)
    hyperparameters = Hyperparameters(0.1, momentum, nesterov)
    split_weight, split_velocity = start.copy(), np.full(size, 0.5, np.float32) if momentum else None
    apply_update(split_weight, split_velocity, gradient.copy(), hyperparameters)
    # The same update, one small piece at a time: below the split threshold.
    for piece in np.array_split(np.arange(size), 8):
        weight, velocity = start[piece], np.full(piece.size, 0.5, np.float32) if momentum else None
        apply_update(weight, velocity, gradient[piece].copy(), hyperparameters)
        np.testing.assert_allclose(split_weight[piece], weight, rtol=1e-6, atol=1e-6)
        if momentum:
            np.testing.assert_allclose(split_velocity[piece], velocity, rtol=1e-6, atol=1e-6)
