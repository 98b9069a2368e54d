import numpy as np
import pytest

from omnikeras.datasets import digits, fashion_mnist
from omnikeras.datasets.fashion_mnist import DEBIAN_DIR


def test_digits_split_is_stable_and_scaled() -> None:
    (x_train, y_train), (x_test, y_test) = digits()
    assert x_train.shape == (1438, 8, 8, 1) and x_test.shape == (359, 8, 8, 1)
    assert x_train.dtype == np.float32 and 0 <= x_train.min() and x_train.max() <= 1
    assert set(np.unique(y_train)) == set(range(10))
    np.testing.assert_array_equal(digits()[0][1], y_train)


@pytest.mark.skipif(not DEBIAN_DIR.exists(), reason="the Debian package dataset-fashion-mnist is not installed")
def test_fashion_mnist_reads_the_debian_files() -> None:
    (x_train, y_train), (x_test, y_test) = fashion_mnist()
    assert x_train.shape == (60000, 28, 28, 1) and x_test.shape == (10000, 28, 28, 1)
    assert x_train.dtype == np.float32 and x_train.max() == 1.0
    assert np.bincount(y_train).tolist() == [6000] * 10
    assert y_test[:5].tolist() == [9, 2, 1, 1, 6]
