"""The Omnivore optimizer on Optuna: the search and the Keras callback that runs it."""

from omnikeras.tuner.callback import OmnivoreCallback
from omnikeras.tuner.search import Config, OmnivoreSearch, Outcome

__all__ = ["Config", "OmnivoreCallback", "OmnivoreSearch", "Outcome"]
