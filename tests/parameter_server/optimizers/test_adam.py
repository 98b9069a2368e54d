"""Adam's step size, `learning_rate * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)`, is the one
Keras computes, operation by operation in the variable's dtype."""

import math

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from omnikeras.parameter_server.optimizers import adam, base  # noqa: E402
from omnikeras.parameter_server.optimizers.base import Bounds, Step  # noqa: E402


def _keras_step_size(learning_rate: float, beta_1: float, beta_2: float, iteration: int) -> float:
    """As `keras.optimizers.Adam.update_step` computes it for a float32 variable."""
    ops = keras.ops
    local_step = ops.cast(iteration + 1, "float32")
    beta_1_power = ops.power(ops.cast(beta_1, "float32"), local_step)
    beta_2_power = ops.power(ops.cast(beta_2, "float32"), local_step)
    alpha = ops.cast(learning_rate, "float32") * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)
    return float(keras.ops.convert_to_numpy(alpha))


@pytest.mark.parametrize("learning_rate, beta_1, beta_2", [(1e-3, 0.9, 0.999), (3e-4, 0.8, 0.9999)])
def test_the_step_size_is_keras_own(learning_rate: float, beta_1: float, beta_2: float) -> None:
    # The first steps, where `1 - beta_2 ** t` cancels most digits and an error in the
    # power shows most (NumPy's float32 power was 1e-4 off there for beta_2 = 0.9999), and
    # some far on.
    for iteration in [*range(300), 1_000, 10_000, 100_000]:
        ours = adam._step_size(np.dtype(np.float32), learning_rate, beta_1, beta_2, iteration)
        assert ours.dtype == np.float32
        assert float(ours) == pytest.approx(_keras_step_size(learning_rate, beta_1, beta_2, iteration), rel=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_rounding_to_a_dtype_is_numpys_cast(dtype: type) -> None:
    rng = np.random.default_rng(0)
    largest = float(np.finfo(dtype).max)
    values = [*rng.normal(scale=10.0, size=1_000), *rng.uniform(-largest, largest, size=100), 1e-9, 5.960464477539063e-08]
    for value in values:
        assert base.rounded(float(value), np.dtype(dtype)) == float(dtype(value))
    # Past the dtype's range, Inf; NaN and Inf as they are.
    assert base.rounded(largest * 2, np.dtype(dtype)) == math.inf
    assert base.rounded(-largest * 2, np.dtype(dtype)) == -math.inf
    assert math.isnan(base.rounded(math.nan, np.dtype(dtype)))
    assert base.rounded(math.inf, np.dtype(dtype)) == math.inf
    # float64 is Python's own float.
    assert base.rounded(0.1, np.dtype(np.float64)) == 0.1


@pytest.mark.parametrize(
    "beta_1, beta_2, iteration, finite",
    [
        (1.0, 0.999, 0, False),  # a first bias correction of 0: Inf
        (0.9, 1.5, 300, False),  # the root of a negative number: NaN
        (1.0, 1.0, 5, False),  # 0 / 0: NaN
        (1.5, 0.999, 300, True),  # a power that overflows: a step of -0
    ],
)
def test_the_edge_cases_give_what_the_dtypes_arithmetic_gives(
    beta_1: float, beta_2: float, iteration: int, finite: bool
) -> None:
    size = adam._step_size(np.dtype(np.float32), 1e-3, beta_1, beta_2, iteration)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        expected = (
            np.float32(1e-3)
            * np.sqrt(1 - np.power(np.float32(beta_2), np.float32(iteration + 1)))
            / (1 - np.power(np.float32(beta_1), np.float32(iteration + 1)))
        )
    # Sign included.
    assert str(size) == str(expected)
    assert math.isfinite(size) == finite
    # A step size of Inf or NaN has no bound: the update is tried on copies and refused.
    before = Bounds(1.0, {"momentum": 1.0, "velocity": 1.0})
    bounds = adam.Adam({"beta_2": beta_2}).bounds_after(before, 1.0, Step(1e-3, beta_1, iteration), np.dtype(np.float32))
    assert (bounds is not None) == finite
