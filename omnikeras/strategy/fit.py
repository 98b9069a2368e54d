"""`model.fit` under `GroupedAsyncStrategy`: join the cluster, train on this worker's part
of the data, and end with the server's final weights."""

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import keras

from omnikeras.strategy import data
from omnikeras.strategy.worker import ClusterWorker


_CHIEF_ONLY_CALLBACKS = (
    keras.callbacks.ModelCheckpoint,
    keras.callbacks.BackupAndRestore,
    keras.callbacks.CSVLogger,
    keras.callbacks.TensorBoard,
)


class ClusterSync(keras.callbacks.Callback):
    """Connects one `fit` to the cluster: the same first weights everywhere, a new group
    layout handed to the input pipeline between steps, and the chief's end of training
    for everyone.

    `fit` adds it by itself under `GroupedAsyncStrategy`, first among the callbacks, so
    that the others see the cluster's weights; its `logs` carry the server's model
    version.
    """

    def __init__(self, worker: ClusterWorker) -> None:
        super().__init__()
        self.worker = worker

    def on_train_begin(self, logs: dict | None = None) -> None:
        # Keras has built the model and its optimizer by now.
        self.worker.start(self.model)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.worker.update_placement()
        if self.worker.stop_requested:
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None and self.worker.last_push is not None:
            logs["model_version"] = self.worker.last_push.model_version


class ClusterLeave(keras.callbacks.Callback):
    """Leaves the cluster when `fit` ends and takes the server's final weights.

    `fit` adds it by itself, last among the callbacks: the ones before it (a tuner) may
    still steer the cluster as training ends.
    """

    def __init__(self, worker: ClusterWorker) -> None:
        super().__init__()
        self.worker = worker

    def on_train_end(self, logs: dict | None = None) -> None:
        self.worker.finish(self.model)


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
    batch_size = arguments.pop("batch_size", None) or 32
    worker.join(batch_size)
    worker.remember_data(x, y, sample_weight)
    batches = data.training_batches(
        x, y, sample_weight, batch_size, arguments.pop("shuffle", True), config.seed
    )
    batch_count = int(batches.cardinality())
    if batch_count > 0 and arguments.get("steps_per_epoch") is None:
        # An endless stream, so that a regrouping while training runs never leaves a
        # worker short of data; an epoch is the steps of the starting layout.
        batches = batches.repeat()
        arguments["steps_per_epoch"] = max(1, -(-batch_count // worker.place.num_groups))
    shard = data.worker_shard(batches, worker.placement)
    sync = ClusterSync(worker)
    callbacks = list(arguments.pop("callbacks", None) or [])
    if not config.is_chief:
        # Validation, checkpoints and logs are the chief's job: the others would overwrite
        # its files with their own.
        callbacks = [c for c in callbacks if not isinstance(c, _CHIEF_ONLY_CALLBACKS)]
        arguments["verbose"] = 0
        for key in ("validation_data", "validation_steps", "validation_batch_size", "validation_freq"):
            arguments.pop(key, None)
    # The shard is shuffled already, alike on every worker.
    return fit(model, x=shard, shuffle=False, callbacks=[sync, *callbacks, ClusterLeave(worker)], **arguments)


def _check_supported(model: keras.Model, arguments: dict[str, Any]) -> None:
    if model.jit_compile:
        warnings.warn(
            "GroupedAsyncStrategy calls the parameter server from inside the train step, "
            "which XLA cannot compile: training without jit_compile",
            stacklevel=3,
        )
        model.jit_compile = False
        model.train_function = None
    if not isinstance(model.optimizer, keras.optimizers.SGD):
        raise TypeError(
            "GroupedAsyncStrategy applies SGD with momentum on the parameter server; "
            f"compile the model with keras.optimizers.SGD, not {type(model.optimizer).__name__}"
        )
    if arguments.get("class_weight") is not None:
        raise ValueError("class_weight is not supported under GroupedAsyncStrategy: pass sample_weight")
