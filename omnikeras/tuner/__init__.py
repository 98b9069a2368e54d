"""The Omnivore optimizer on Optuna: the search, the tuner that runs it phase by phase,
and the Keras callback that drives the tuner inside `fit`.

The callback needs TensorFlow and loads it on first use; the search, the tuner and the
study's storage do not.
"""

import importlib
from typing import Any

from omnikeras.tuner.search import Config, OmnivoreSearch, Outcome, rank
from omnikeras.tuner.tuning import Step, Tuner, TuningCluster, TuningSettings


def __getattr__(name: str) -> Any:
    if name == "OmnivoreCallback":
        return importlib.import_module("omnikeras.tuner.callback").OmnivoreCallback
    raise AttributeError(f"module 'omnikeras.tuner' has no attribute {name!r}")


__all__ = [
    "Config",
    "OmnivoreCallback",
    "OmnivoreSearch",
    "Outcome",
    "Step",
    "Tuner",
    "TuningCluster",
    "TuningSettings",
    "rank",
]
