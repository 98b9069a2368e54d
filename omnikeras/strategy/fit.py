"""`model.fit` under `GroupedAsyncStrategy`: join the cluster, train on this worker's part
of the data, and end with the server's final weights."""

import inspect
import json
import warnings
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from omnikeras.strategy import data
from omnikeras.strategy.update_rule import as_written, server_update_rule, uses_schedule
from omnikeras.strategy.worker import ClusterWorker

_CHIEF_ONLY_CALLBACKS = (
    keras.callbacks.ModelCheckpoint,
    keras.callbacks.BackupAndRestore,
    keras.callbacks.CSVLogger,
    keras.callbacks.TensorBoard,
)
_LEARNING_RATE_CALLBACKS = (keras.callbacks.LearningRateScheduler, keras.callbacks.ReduceLROnPlateau)


class ClusterSync(keras.callbacks.Callback):
    """Connects one `fit` to the cluster: the same first weights everywhere, and the
    chief's end of training for everyone.

    `fit` adds it by itself under `GroupedAsyncStrategy`, first among the callbacks, so
    that the others see the cluster's weights; its `logs` carry the server's model
    version.
    """

    # Keras runs the batch hooks of async-safe callbacks on a thread of their own, as it
    # does in plain `fit`, instead of between one step and the next: a stop then takes
    # effect a step later.
    async_safe = True

    def __init__(self, worker: ClusterWorker) -> None:
        super().__init__()
        self.worker = worker

    def on_train_begin(self, logs: dict | None = None) -> None:
        # Keras has built the model and its optimizer by now.
        self.worker.start(self.model)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.worker.begin_epoch()
        self.worker.wait_for_the_chief(self.model)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.worker.stop_requested:
            self.model.stop_training = True

    def on_train_end(self, logs: dict | None = None) -> None:
        # The weights as training left them: `ClusterLeave` tells from them whether a
        # callback chose others (`EarlyStopping`'s best weights).
        chief = self.worker.config.is_chief
        self.worker.weights_at_end = self.worker.server_weights(self.model) if chief else None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is None or self.worker.last_push is None:
            return
        logs["model_version"] = self.worker.last_push.model_version
        if self.worker.config.is_chief:
            logs.update(self.worker.rule_in_force())


class LearningRateRelay(keras.callbacks.Callback):
    """Hands the chief's learning rate to the server where a callback changed it between
    epochs: `LearningRateScheduler` as an epoch begins, `ReduceLROnPlateau` as one ends.
    A rate set between steps (a one-cycle policy) goes with the step that reads it (see
    `ClusterWorker.push_pull`).

    `fit` adds it on the chief, after the user's callbacks.
    """

    def __init__(self, worker: ClusterWorker) -> None:
        super().__init__()
        self.worker = worker

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.worker.relayed_learning_rate = self._learning_rate()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._relay()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._relay()

    def _learning_rate(self) -> float | None:
        optimizer = self.model.optimizer
        # A schedule runs on the server by itself, or the workers push the rate it gives.
        if uses_schedule(optimizer):
            return None
        # One replica's copy: reading the mirrored variable costs twice as much.
        rate = self.model.distribute_strategy.experimental_local_results(optimizer.learning_rate.value)[0]
        return as_written(float(rate.numpy()))

    def _relay(self) -> None:
        rate = self._learning_rate()
        if rate is not None:
            self.worker.relay_learning_rate(rate)


class PassProgress(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, for epochs that are passes over the data: each epoch's length
    is this worker's share of a pass in the present layout, which Keras cannot know, and
    the bar ends at the steps the epoch took.

    `fit` adds it on the chief unless the user gave a `ProgbarLogger` of their own.
    """

    # As the progress bar plain `fit` adds: its batch hook runs off the training loop.
    async_safe = True

    def __init__(self, worker: ClusterWorker) -> None:
        super().__init__()
        self.worker = worker
        self._steps: int | None = None

    def set_params(self, params: dict) -> None:
        super().set_params(params)
        # `steps_per_epoch`, when the user gave it.
        self._steps = params["steps"]

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.target = self._steps or self.worker.steps_per_epoch
        super().on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.progbar is not None:
            self.target = self.progbar.target = self.seen
        super().on_epoch_end(epoch, logs)


class ClusterLeave(keras.callbacks.Callback):
    """Leaves the cluster when `fit` ends and takes the final weights: the server's, or
    those a callback on the chief chose as training ended
    (`EarlyStopping(restore_best_weights=True)`), which the chief puts on the servers for
    every worker. Every worker's `fit` returns the chief's History, which alone holds the
    validation metrics.

    `fit` adds it by itself, last among the callbacks: the ones before it (a tuner) may
    still steer the cluster as training ends.
    """

    def __init__(self, worker: ClusterWorker) -> None:
        super().__init__()
        self.worker = worker

    def on_train_end(self, logs: dict | None = None) -> None:
        history: keras.callbacks.History | None = getattr(self.model, "history", None)
        chief = self.worker.config.is_chief
        chosen = self.worker.server_weights(self.model) if chief else None
        left = self.worker.weights_at_end
        if chosen is not None and left is not None and _same(chosen, left):
            chosen = None
        chief_history = self.worker.finish(self.model, history_json(history) if chief else "", chosen)
        if not chief and history is not None and chief_history:
            history.epoch, history.history = history_from_json(chief_history)


def history_json(history: keras.callbacks.History | None) -> str:
    """`history`'s epochs and metrics as JSON ("" for none)."""
    if history is None or not hasattr(history, "epoch"):
        return ""
    return json.dumps({"epoch": history.epoch, "history": history.history}, default=float)


def history_from_json(text: str) -> tuple[list[int], dict[str, list]]:
    """The epochs and metrics of a History that `history_json` wrote."""
    parsed = json.loads(text)
    return list(parsed["epoch"]), dict(parsed["history"])


def _same(weights: dict[str, np.ndarray], others: dict[str, np.ndarray]) -> bool:
    return weights.keys() == others.keys() and all(np.array_equal(w, others[name]) for name, w in weights.items())


def fit_through_server(
    model: keras.Model, fit: Callable[..., keras.callbacks.History], *args: Any, **kwargs: Any
) -> keras.callbacks.History:
    arguments = inspect.signature(fit).bind(model, *args, **kwargs).arguments
    arguments.pop("self")
    strategy = model.distribute_strategy
    worker: ClusterWorker = strategy.worker
    config = worker.config
    _check_supported(model, arguments)

    x, y, sample_weight = arguments.pop("x", None), arguments.pop("y", None), arguments.pop("sample_weight", None)
    validation_split = arguments.pop("validation_split", 0.0)
    if validation_split:
        (x, y, sample_weight), arguments["validation_data"] = data.split_validation(
            x, y, sample_weight, validation_split
        )
    batch_size = arguments.pop("batch_size", None)
    if arguments.get("validation_batch_size") is None:
        # Keras validates in batches of `batch_size` unless told otherwise; `fit` below
        # reads the shares, without it.
        arguments["validation_batch_size"] = batch_size
    batch_size = batch_size or 32
    worker.join(batch_size)
    worker.remember_data(x, y, sample_weight)
    source = data.batch_source(
        x, y, sample_weight, batch_size, arguments.pop("shuffle", True), config.seed, arguments.pop("class_weight", None)
    )
    shares = worker.read_from(source, epochs_by_pass=arguments.get("steps_per_epoch") is None)
    sync = ClusterSync(worker)
    callbacks = list(arguments.pop("callbacks", None) or [])
    _check_one_learning_rate_owner(model, callbacks)
    chief_callbacks: list[keras.callbacks.Callback] = []
    if config.is_chief:
        chief_callbacks.append(LearningRateRelay(worker))
    if config.is_chief and not any(isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks):
        chief_callbacks.append(PassProgress(worker))
    if not config.is_chief:
        # Validation, checkpoints and logs are the chief's job: the others would overwrite
        # its files with their own.
        callbacks = [c for c in callbacks if not isinstance(c, _CHIEF_ONLY_CALLBACKS)]
        arguments["verbose"] = 0
        for key in ("validation_data", "validation_steps", "validation_batch_size", "validation_freq"):
            arguments.pop(key, None)
    worker.failure = None
    worker.fitting = True
    try:
        # The shares are shuffled already, alike on every worker.
        return fit(model, x=shares, shuffle=False, callbacks=[sync, *callbacks, *chief_callbacks, ClusterLeave(worker)], **arguments)
    except Exception:
        # An exchange's error reaches here wrapped in TensorFlow's: the user gets it as raised.
        if worker.failure is not None:
            raise worker.failure from None
        raise
    finally:
        worker.fitting = False


def _check_supported(model: keras.Model, arguments: dict[str, Any]) -> None:
    if model.jit_compile:
        warnings.warn(
            "GroupedAsyncStrategy calls the parameter server from inside the train step, "
            "which XLA cannot compile: training without jit_compile",
            stacklevel=3,
        )
        model.jit_compile = False
        model.train_function = None
    # What the server cannot apply fails before the worker joins; the variables may be
    # built only as training starts, when the worker checks them again.
    server_update_rule(model.optimizer, model.trainable_variables)


def _check_one_learning_rate_owner(model: keras.Model, callbacks: list[keras.callbacks.Callback]) -> None:
    """A tuner of the learning rate (`OmnivoreCallback`) shares it with nothing else."""
    tuners = [type(c).__name__ for c in callbacks if getattr(c, "tunes_learning_rate", False)]
    if not tuners:
        return
    others = [type(c).__name__ for c in callbacks if isinstance(c, _LEARNING_RATE_CALLBACKS)]
    if uses_schedule(model.optimizer):
        rate = model.optimizer._learning_rate
        others.append(f"the optimizer's {getattr(rate, '__name__', type(rate).__name__)} schedule")
    if others:
        raise ValueError(
            f"{tuners[0]} tunes the learning rate, so it cannot also follow {', '.join(others)}: "
            "compile with a constant rate and leave the rate to the tuner, or remove the tuner"
        )
