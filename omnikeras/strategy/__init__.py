"""Keras `model.fit` across worker processes through the parameter server."""

from omnikeras.strategy import keras_hooks
from omnikeras.strategy.strategy import GroupedAsyncStrategy

keras_hooks.install()

__all__ = ["GroupedAsyncStrategy"]
