"""The places where `GroupedAsyncStrategy` enters Keras' training loop.

1. `TFOptimizer._distributed_tf_update_step` runs once per step, in cross-replica context,
   with the group-reduced gradients: instead of updating locally, the strategy pushes
   them to the parameter server and assigns the weights that come back. Where only
   TensorFlow can evaluate the learning rate (a schedule of the user's own), the rate
   Keras evaluated goes with them, and `optimizer.iterations` follows the servers'
   count. Weight decay (`TFOptimizer._apply_weight_decay`) is the server's too: done
   locally it would be overwritten by the pulled weights, and, since nothing orders it
   after the step's read of its data, it would be left in place by the step that finds an
   epoch's data at its end.
2. `TensorFlowTrainer.fit`: before training, the worker joins the cluster and takes its
   own part of the data; at the end it waits for the others and takes the final weights.
3. `TFEpochIterator.catch_stop_iteration`: an epoch is a pass over the data, whose number
   of steps changes with the group layout, so the end of one epoch says nothing of the
   next (Keras would take the first epoch's steps for every later one and warn that the
   data ran out at each epoch's end).
4. `TFOptimizer._all_reduce_sum_gradients`: with one local replica, the gradients go to
   the step as backpropagation produces them. Keras' sum over the replicas is then the
   gradient itself, but it joins every gradient in one op (`tf.custom_gradient`'s
   `IdentityN`), so the gradients written ahead of the push would wait for the last one.
5. `LossScaleOptimizer._tf_apply`: Keras skips a step whose loss-scaled gradients,
   combined across the replicas, overflow, and lowers the scale. A group's members are
   those replicas, but each sees only its own gradients: a member that overflows pushes
   anyway, flagged, so that its group step goes on and skips the update, and every
   member sets its scale from what the group step did (see `_apply_loss_scaled`).
6. `TensorFlowTrainer._maybe_symbolic_build`: under any strategy Keras builds the model
   from a batch before training, which a model without `call` (keras-io's VAE: a train
   step of its own over sub-models) cannot be; without a strategy Keras leaves it to
   the train step's tracing, and so does this one for such a model, building only its
   optimizer beforehand.
7. `TFEpochIterator.__next__`: the worker knows before a step whether it would read past
   its epoch (the exchange before chose its share), so the epoch ends there, and Keras
   begins no step (no callback's `on_train_batch_begin`) that would only find the data's
   end: callbacks see each epoch's steps as in plain Keras.
8. `TFOptimizer.apply`: Keras applies each variable's constraint after the optimizer's
   step, with `use_ema` moves each weight's average, and with
   `gradient_accumulation_steps` updates only every so many steps. The server does all
   three (see `parameter_server.constraints` and `ModelState`), so the worker leaves them
   out of the step: applied again to the weights pulled, a constraint that moves a weight
   only part of the way (MinMaxNorm with a rate below 1) would move it twice, the
   worker's averages would miss the other groups' updates, and a step that only
   accumulated would push nothing (its exchange hands out the next batch); under
   accumulation the server clips the gradients too (the mean Keras clips is its).
9. `TFOptimizer.finalize_variable_values`: with `use_ema`, Keras puts each weight's
   average in its place as `fit` ends. The server does, as the training ends, unless
   the chief set the final weights (a callback's choice, as in Keras, where it comes
   after); every worker then takes them.

The training data reaches the train step without a hook: the strategy's
`experimental_distribute_dataset` gives Keras a `data.ShareFeed` in place of the dataset,
and Keras' train function runs one step on each element of an iterator that is not
tf.data's (`TensorFlowTrainer._make_function`), also private behaviour.

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
from keras import ops
from keras.src.backend.tensorflow.optimizer import TFOptimizer
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer, TFEpochIterator
from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer
from packaging.version import Version

from omnikeras.strategy.data import ShareFeed
from omnikeras.strategy.fit import fit_through_server
from omnikeras.strategy.strategy import GroupedAsyncStrategy
from omnikeras.strategy.update_rule import rate_from_worker, uses_schedule

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
_original_all_reduce_sum_gradients = TFOptimizer._all_reduce_sum_gradients
_original_fit = TensorFlowTrainer.fit
_original_catch_stop_iteration = TFEpochIterator.catch_stop_iteration
_original_loss_scale_apply = LossScaleOptimizer._tf_apply
_original_maybe_symbolic_build = TensorFlowTrainer._maybe_symbolic_build
_original_epoch_next = TFEpochIterator.__next__
_original_apply = TFOptimizer.apply
_original_finalize_variable_values = TFOptimizer.finalize_variable_values


@functools.wraps(_original_update_step)
def _update_step(self: TFOptimizer, distribution: Any, grads_and_vars: list, learning_rate: Any) -> None:
    if isinstance(distribution, GroupedAsyncStrategy):
        distribution.worker.check_applying(self)
        if not rate_from_worker(self):
            # The optimizer's own rate (a variable, which a callback may set) is relayed
            # where it changed; a schedule the server runs has nothing to relay.
            rate = None if uses_schedule(self) else learning_rate.value
            distribution.apply_through_server(grads_and_vars, learning_rate=rate)
            return
        iterations = distribution.apply_through_server(grads_and_vars, learning_rate=learning_rate, rate_from_worker=True)
        assert iterations is not None, "a pushed rate brings the servers' count back"
        # Keras counts the step once this returns: the next one evaluates its rate at
        # the servers' count, which the other groups' updates advance too.
        self.iterations.assign(iterations - 1)
        return
    return _original_update_step(self, distribution, grads_and_vars, learning_rate)


@functools.wraps(_original_apply_weight_decay)
def _apply_weight_decay(self: TFOptimizer, variables: list) -> None:
    if not isinstance(self._distribution_strategy, GroupedAsyncStrategy):
        _original_apply_weight_decay(self, variables)


@functools.wraps(_original_all_reduce_sum_gradients)
def _all_reduce_sum_gradients(self: TFOptimizer, grads_and_vars: list) -> list:
    distribution = self._distribution_strategy
    if isinstance(distribution, GroupedAsyncStrategy) and distribution.num_replicas_in_sync == 1:
        return list(grads_and_vars)
    return _original_all_reduce_sum_gradients(self, grads_and_vars)


@functools.wraps(_original_fit)
def _fit(self: TensorFlowTrainer, *args: Any, **kwargs: Any) -> keras.callbacks.History:
    if isinstance(self.distribute_strategy, GroupedAsyncStrategy):
        return fit_through_server(self, _original_fit, *args, **kwargs)
    return _original_fit(self, *args, **kwargs)


@functools.wraps(_original_maybe_symbolic_build)
def _maybe_symbolic_build(self: TensorFlowTrainer, iterator: Any = None, data_batch: Any = None) -> None:
    if isinstance(self._distribute_strategy, GroupedAsyncStrategy) and type(self).call is keras.Model.call:
        if self.optimizer is not None and not self.optimizer.built:
            with self.distribute_strategy.scope():
                self.optimizer.build(self.trainable_variables)
        return
    _original_maybe_symbolic_build(self, iterator, data_batch)


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


@functools.wraps(_original_epoch_next)
def _epoch_next(self: TFEpochIterator) -> tuple:
    strategy = self._distribute_strategy
    if isinstance(strategy, GroupedAsyncStrategy):
        worker = strategy.worker
        # The training data's feed only, not validation's iterator (whose adapter would
        # build its dataset anew if asked for it).
        if isinstance(self._distributed_dataset, ShareFeed) and worker.epoch_over():
            self._current_iterator = None
            self.data_adapter.on_epoch_end()
            raise StopIteration
    return _original_epoch_next(self)


@functools.wraps(_original_apply)
def _apply(self: TFOptimizer, grads: list, trainable_variables: list | None = None) -> None:
    if not isinstance(self._distribution_strategy, GroupedAsyncStrategy):
        return _original_apply(self, grads, trainable_variables)
    variables = getattr(self, "_trainable_variables", []) if trainable_variables is None else trainable_variables
    constrained = {id(v): (v, v.constraint) for v in variables if v.constraint is not None}
    left_to_the_server = ["use_ema", "gradient_accumulation_steps"]
    if self.gradient_accumulation_steps:
        left_to_the_server += ["clipnorm", "global_clipnorm", "clipvalue"]
    settings = {name: getattr(self, name) for name in left_to_the_server}
    # Keras reads them as it traces the step: the step it traces has none of them.
    for variable, _ in constrained.values():
        variable.constraint = None
    for name in left_to_the_server:
        setattr(self, name, None)
    try:
        return _original_apply(self, grads, trainable_variables)
    finally:
        for name, value in settings.items():
            setattr(self, name, value)
        for variable, constraint in constrained.values():
            variable.constraint = constraint


@functools.wraps(_original_finalize_variable_values)
def _finalize_variable_values(self: TFOptimizer, var_list: list) -> None:
    if not isinstance(self._distribution_strategy, GroupedAsyncStrategy):
        _original_finalize_variable_values(self, var_list)


@functools.wraps(_original_loss_scale_apply)
def _loss_scale_apply(self: LossScaleOptimizer, grads: list, trainable_variables: list | None = None) -> None:
    if not isinstance(self._distribution_strategy, GroupedAsyncStrategy):
        return _original_loss_scale_apply(self, grads, trainable_variables)
    tf.distribute.get_replica_context().merge_call(_apply_loss_scaled, args=(self, grads, trainable_variables))


def _apply_loss_scaled(
    distribution: GroupedAsyncStrategy, optimizer: LossScaleOptimizer, grads: list, trainable_variables: list | None
) -> None:
    """`LossScaleOptimizer`'s step in cross-replica context, as Keras takes it, except that
    the group's members, not only this worker's replicas, decide together whether the
    step is skipped: a step whose gradients overflowed is pushed all the same, flagged
    (zeros in place of its gradients), and the scale follows the group step's outcome."""
    variables = trainable_variables or optimizer._trainable_variables
    # Every local replica's: the gradients combined from them overflow where any does.
    finite = ops.all(
        ops.stack(
            distribution.experimental_local_results(
                distribution.extended.call_for_each_replica(optimizer.check_finite, args=(grads,))
            )
        )
    )

    def update() -> None:
        distribution.extended.call_for_each_replica(_apply_unscaled, args=(optimizer, grads, trainable_variables))

    def skip() -> None:
        distribution.apply_through_server(
            [(tf.zeros(v.shape, v.dtype), v.value) for g, v in zip(grads, variables) if g is not None],
            skip_update=True,
        )

    def uncount() -> None:
        optimizer.iterations.assign_sub(1)

    def lower_scale() -> None:
        optimizer._stateful_handle_non_finite_grads()
        # Keras counts no skipped step: the update of this worker's finite gradients
        # counted one that its group skipped.
        ops.cond(finite, uncount, lambda: None)

    # After an update, Keras' `_stateful_handle_finite_grads` doubles the scale every
    # `dynamic_growth_steps` updates.
    def upscale() -> None:
        optimizer.step_counter.assign(0)
        optimizer.dynamic_scale.assign(optimizer.dynamic_scale * 2.0)

    def increment() -> None:
        optimizer.step_counter.assign_add(1)

    def raise_scale() -> None:
        ops.cond(ops.equal(optimizer.step_counter, optimizer.dynamic_growth_steps - 1), upscale, increment)

    with distribution.reporting_skipped():
        ops.cond(finite, update, skip)
    ops.cond(distribution.update_skipped(), lower_scale, raise_scale)


def _apply_unscaled(optimizer: LossScaleOptimizer, grads: list, trainable_variables: list | None) -> None:
    """The update of `LossScaleOptimizer`'s finite gradients, in a replica's context,
    without its change of the scale, which waits for the group step's outcome."""
    tvs = trainable_variables or optimizer._trainable_variables
    unscaled = [
        g if g is None or optimizer._overwrite_variable_with_gradient(v) else ops.divide(g, optimizer.dynamic_scale)
        for g, v in zip(grads, tvs)
    ]
    optimizer.inner_optimizer.apply(unscaled, trainable_variables=trainable_variables)


def install() -> None:
    TFOptimizer._distributed_tf_update_step = _update_step
    TFOptimizer._apply_weight_decay = _apply_weight_decay
    TFOptimizer._all_reduce_sum_gradients = _all_reduce_sum_gradients
    TensorFlowTrainer.fit = _fit
    TFEpochIterator.catch_stop_iteration = _catch_stop_iteration
    LossScaleOptimizer._tf_apply = _loss_scale_apply
    TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    TFEpochIterator.__next__ = _epoch_next
    TFOptimizer.apply = _apply
    TFOptimizer.finalize_variable_values = _finalize_variable_values
