import numpy as np
import pytest

from omnikeras.parameter_server import parallel
from omnikeras.parameter_server.optimizers.sgd import apply_update
from omnikeras.parameter_server.schedules import LearningRateSchedule
from omnikeras.parameter_server.update_rule import Hyperparameters


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
        apply_update(weight, velocity, gradient.copy(), 0.1, momentum, nesterov)

    tolerance = 1e-2 if dtype == "float16" else 1e-6
    np.testing.assert_allclose(weight, keras.ops.convert_to_numpy(variable), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"momentum": 1.0}, "momentum"),
        ({"momentum": float("inf")}, "momentum"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"learning_rate": -0.1, "learning_rate_from_workers": True}, "learning_rate"),
        ({"learning_rate": float("nan"), "learning_rate_from_workers": True}, "learning_rate"),
        (
            {
                "learning_rate_from_workers": True,
                "learning_rate_schedule": LearningRateSchedule("ExponentialDecay", {
                    "initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5, "staircase": False
                }),
            },
            "cannot come from the workers too",
        ),
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
    split_weight, split_velocity = start.copy(), np.full(size, 0.5, np.float32) if momentum else None
    apply_update(split_weight, split_velocity, gradient.copy(), 0.1, momentum, nesterov)
    # The same update, one small piece at a time: below the split threshold.
    for piece in np.array_split(np.arange(size), 8):
        weight, velocity = start[piece], np.full(piece.size, 0.5, np.float32) if momentum else None
        apply_update(weight, velocity, gradient[piece].copy(), 0.1, momentum, nesterov)
        np.testing.assert_allclose(split_weight[piece], weight, rtol=1e-6, atol=1e-6)
        if momentum:
            np.testing.assert_allclose(split_velocity[piece], velocity, rtol=1e-6, atol=1e-6)


def test_the_server_follows_keras_sgd_with_a_schedule_weight_decay_and_exclusions() -> None:
    keras = pytest.importorskip("keras")
    from omnikeras.parameter_server.model_state import ModelState

    rng = np.random.default_rng(1)
    starts = {"kernel": rng.normal(size=(4, 3)).astype("float32"), "bias": rng.normal(size=3).astype("float32")}
    steps = [{name: rng.normal(size=w.shape).astype("float32") for name, w in starts.items()} for _ in range(30)]
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=5, decay_rate=0.7)
    optimizer = keras.optimizers.SGD(schedule, momentum=0.9, weight_decay=0.05)
    variables = {name: keras.Variable(w.copy(), name=name) for name, w in starts.items()}
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    for gradients in steps:
        optimizer.apply_gradients([(keras.ops.convert_to_tensor(gradients[n]), variables[n]) for n in starts])

    state = ModelState(
        Hyperparameters(
            momentum=0.9,
            learning_rate_schedule=LearningRateSchedule("ExponentialDecay", schedule.get_config()),
            weight_decay=0.05,
            no_weight_decay=frozenset({"bias"}),
        )
    )
    state.initialize({name: w.copy() for name, w in starts.items()})
    for gradients in steps:
        state.apply({name: g.copy() for name, g in gradients.items()})

    assert state.iterations == 30
    for name, variable in variables.items():
        np.testing.assert_allclose(state.weights[name], keras.ops.convert_to_numpy(variable), rtol=1e-5, atol=1e-6)
    # Without the schedule and decay the weights end elsewhere: the test can tell.
    assert not np.allclose(state.weights["kernel"], starts["kernel"] - 0.1 * sum(g["kernel"] for g in steps), atol=1e-3)
