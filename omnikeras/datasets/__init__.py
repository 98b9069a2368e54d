"""Data sets that work offline: Fashion-MNIST and scikit-learn's digits."""

from omnikeras.datasets.digits import digits
from omnikeras.datasets.fashion_mnist import fashion_mnist

__all__ = ["digits", "fashion_mnist"]
