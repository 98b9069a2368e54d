"""The two places where `GroupedAsyncStrategy` enters Keras' training loop.

1. `TFOptimizer._distributed_tf_update_step` runs once per step, in cross-replica context,
   with the group-reduced gradients: instead of updating locally, the strategy pushes
   them to the parameter server and assigns the weights that come back. Weight decay
   (`TFOptimizer._apply_weight_decay`) is the server's too: done locally it would be
   overwritten by the pulled weights, and, since nothing orders it after the step's read
   of its data, it would be left in place by the step that finds an epoch's data at its end.
2. `TensorFlowTrainer.fit`: before training, the worker joins the cluster and takes its
   own part of the data; at the end it waits for the others and takes the final weights.
3. `TFEpochIterator.catch_stop_iteration`: an epoch is a pass over the data, whose number
   of steps changes with the group layout, so the end of one epoch says nothing of the
   next (Keras would take the first epoch's steps for every later one and warn that the
   data ran out at each epoch's end).

All are private to Keras, so the supported Keras range is pinned and checked here, and
tests fail if a hook stops being called. Models under any other strategy go through
the original methods untouched.
"""

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow.optimizer import TFOptimizer
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer, TFEpochIterator
from packaging.version import Version

from omnikeras.strategy.fit import fit_through_server
from omnikeras.strategy.strategy import GroupedAsyncStrategy

SUPPORTED_KERAS = (Version("3.15"), Version("3.16"))

if not SUPPORTED_KERAS[0] <= Version(keras.__version__) < SUPPORTED_KERAS[1]:
    raise ImportError(
        f"omnikeras supports Keras >={SUPPORTED_KERAS[0]},<{SUPPORTED_KERAS[1]}; "
        f"Keras {keras.__version__} is installed"
    )
if keras.backend.backend() != "tensorflow":
    raise ImportError(
        f"GroupedAsyncStrategy needs Keras' TensorFlow backend; KERAS_BACKEND is {keras.backend.backend()!r}"
    )

_original_update_step = TFOptimizer._distributed_tf_update_step
_original_apply_weight_decay = TFOptimizer._apply_weight_decay
_original_fit = TensorFlowTrainer.fit
_original_catch_stop_iteration = TFEpochIterator.catch_stop_iteration


@functools.wraps(_original_update_step)
def _update_step(self: TFOptimizer, distribution: Any, grads_and_vars: list, learning_rate: Any) -> None:
    if isinstance(distribution, GroupedAsyncStrategy):
        return distribution.apply_through_server(grads_and_vars)
    return _original_update_step(self, distribution, grads_and_vars, learning_rate)


@functools.wraps(_original_apply_weight_decay)
def _apply_weight_decay(self: TFOptimizer, variables: list) -> None:
    if not isinstance(self._distribution_strategy, GroupedAsyncStrategy):
        _original_apply_weight_decay(self, variables)


@functools.wraps(_original_fit)
def _fit(self: TensorFlowTrainer, *args: Any, **kwargs: Any) -> keras.callbacks.History:
    if isinstance(self.distribute_strategy, GroupedAsyncStrategy):
        return fit_through_server(self, _original_fit, *args, **kwargs)
    return _original_fit(self, *args, **kwargs)


@contextlib.contextmanager
def _catch_stop_iteration(self: TFEpochIterator) -> Iterator[None]:
    if not isinstance(self._distribute_strategy, GroupedAsyncStrategy):
        with _original_catch_stop_iteration(self):
            yield
        return
    try:
        yield
        self.tf_sync()
    except (StopIteration, tf.errors.OutOfRangeError):
        self._current_iterator = None
        self.data_adapter.on_epoch_end()


def install() -> None:
    TFOptimizer._distributed_tf_update_step = _update_step
    TFOptimizer._apply_weight_decay = _apply_weight_decay
    TensorFlowTrainer.fit = _fit
    TFEpochIterator.catch_stop_iteration = _catch_stop_iteration
