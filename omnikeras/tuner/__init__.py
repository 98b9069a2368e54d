"""The Omnivore optimizer on Optuna: the search and the Keras callback that runs it.

The callback needs TensorFlow and loads it on first use; the search and the study's
storage do not.
"""

import importlib
from typing import Any

from omnikeras.tuner.search import Config, OmnivoreSearch, Outcome


def __getattr__(name: str) -> Any:
    if name == "OmnivoreCallback":
        return importlib.import_module("omnikeras.tuner.callback").OmnivoreCallback
    raise AttributeError(f"module 'omnikeras.tuner' has no attribute {name!r}")


__all__ = ["Config", "OmnivoreCallback", "OmnivoreSearch", "Outcome"]
