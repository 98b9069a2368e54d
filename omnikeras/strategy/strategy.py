"""`GroupedAsyncStrategy`: Keras `model.fit` across worker processes, through the
parameter server."""

import contextlib
import dataclasses
import functools
from collections.abc import Iterator

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from omnikeras import tf_config
from omnikeras.config import WorkerConfig
from omnikeras.parameter_server.buffer_layout import BufferLayout
from omnikeras.strategy.data import ShareFeed
from omnikeras.strategy.own_cluster import own_cluster
from omnikeras.strategy.worker import ClusterWorker


class GroupedAsyncStrategy(tf.distribute.MirroredStrategy):
    """Trains a Keras model with grouped asynchronous SGD through a parameter server.

    Each worker process runs the same script. Inside the process, the strategy mirrors the
    model over the local devices (the CPU, or every local GPU) like `MirroredStrategy`.
    Across processes, workers form groups on the parameter server: at every step, each
    worker pushes its gradient, the server applies ONE update per group from the members'
    gradients (weighted by their example counts), and the worker continues from the
    weights that come back. Groups do not wait for each other.

    `fit` behaves as usual on the chief (worker 0): progress bar, validation, callbacks
    and History. The other workers train silently on their own part of the data. When
    `fit` returns, every worker's model holds the server's final weights.

    The optimizer the model was compiled with runs on the server: any of
    `keras.optimizers`' built-in ones (SGD, Adam, AdamW, RMSprop, ..., given as an object
    or by name, or inside a `LossScaleOptimizer`), with its learning rate (a number, one
    of Keras' built-in schedules, which the server evaluates at its own iteration count,
    or a schedule of the user's own or a function, which each worker evaluates as Keras
    does at the servers' iteration count and pushes with its gradients), its
    momentum-like setting, its weight decay, its gradient accumulation and its moving
    average of the weights (`use_ema`, which the model ends `fit` with); so are the
    variables' built-in constraints (`MaxNorm`, `NonNeg`, ...), after each update.
    `LearningRateScheduler`, `ReduceLROnPlateau` and callbacks of the user's own that set
    the learning rate, on the chief, change the server's rate. Gradient clipping applies
    to each worker's gradients before its group combines them (under gradient
    accumulation, the server clips their mean). A constraint of the user's own, which the
    server cannot apply, raises an error when `fit` starts.

    Asynchrony adds momentum of its own (about 1 - 1/g with g groups), and stale gradients
    make large steps unstable. With more than one group the servers compensate, unless
    told not to: they lower the explicit momentum in force by the implicit momentum the
    measured staleness adds (to zero or below where that alone is more), keep the
    effective step `learning_rate / (1 - momentum)` by raising the rate in force as the
    momentum comes down, and cap that step while the staleness makes it unstable: a
    warm-up that grows while the training loss improves, halved where the loss climbs
    (see `omnikeras.parameter_server.compensation`). The chief's epoch `logs` carry
    `explicit_momentum`, `implicit_momentum`, `learning_rate_in_force`,
    `step_backoffs` and `step_share` (the share of the compiled step the cap allows).

    Args:
        config: The worker's place in the cluster. None (the default) reads it from the
            `OMNIKERAS_CONFIG` environment variable, which `omnikeras launch` sets, or
            from `TF_CONFIG`; where neither is set (a script run as `python train.py`),
            the process trains as a single worker against a parameter server of its
            own, started here and stopped when the process ends.
        devices: Local devices to mirror over; None (the default) takes all of them.
        compensate_asynchrony: Compensate the momentum and the step that asynchrony
            changes. None (the default) takes the config's (`omnikeras launch
            --no-compensation` turns it off), which defaults to True; False applies the
            compiled momentum and learning rate as they are. Every worker takes the
            chief's choice.

    Example:

    ```python
    strategy = omnikeras.GroupedAsyncStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=64, epochs=3)
    ```
    """

    def __init__(
        self,
        config: WorkerConfig | None = None,
        devices: list[str] | None = None,
        compensate_asynchrony: bool | None = None,
    ) -> None:
        config = config or tf_config.worker_config_from_env() or own_cluster()
        if compensate_asynchrony is not None:
            config = dataclasses.replace(config, compensate_asynchrony=compensate_asynchrony)
        super().__init__(devices=devices)
        self.config = config
        self.worker = ClusterWorker(config)
        # Whether the last group step skipped its update (see `update_skipped`); on the
        # CPU, where the exchange runs.
        with tf.device("/cpu:0"):
            self._update_skipped = unmirrored_variable(tf.constant(False), tf.TensorShape([]))
        # Set while loss scaling traces its step, which reads `update_skipped`.
        self._reporting_skipped = False

    def experimental_distribute_dataset(
        self, dataset: tf.data.Dataset, options: tf.distribute.InputOptions | None = None
    ) -> tf.data.Dataset | tf.distribute.DistributedDataset | ShareFeed:
        """For the training data of `fit`, the shares each step's exchange chooses
        (`ShareFeed`): no dataset's iterator reads them ahead. Any other dataset (the
        validation data's) is distributed as `MirroredStrategy` does, and with one local
        device, it is taken as it is: there is nothing to split across replicas, and a
        distributed iterator costs about 3% of a small model's step."""
        if dataset is self.worker.shares:
            return self.worker.feed(self)
        if self.num_replicas_in_sync == 1:
            return dataset
        return super().experimental_distribute_dataset(dataset, options)

    def apply_through_server(
        self,
        grads_and_vars: list[tuple[tf.Tensor, tf.Variable]],
        skip_update: bool = False,
        learning_rate: tf.Tensor | None = None,
        rate_from_worker: bool = False,
    ) -> tf.Tensor | None:
        """One group step inside the compiled train step: the group-reduced gradients (and
        the batch-normalization statistics) go to the server and the weights it returns
        are assigned to every replica's variables.

        Called by Keras' optimizer in cross-replica context, once per step; under loss
        scaling, with `skip_update` where the step's gradients overflowed (they are zeros
        then), so that the group step goes on without an update (see `update_skipped`).
        `learning_rate` is the rate Keras evaluated for this step. With
        `rate_from_worker` (a schedule the server cannot run), it goes to the server with
        the gradients, and the server's iteration count after the group step is returned;
        otherwise (the optimizer's own rate) the chief relays it where a callback changed
        it.
        """
        trained = [variable for _, variable in grads_and_vars]
        # By path: Keras leaves out the variables without a gradient.
        names = tuple(self.worker.path_of(variable) for variable in trained)
        self.worker.expect_gradients(names)
        # After Keras' all-reduce every replica holds the same sum: one copy goes out.
        gradients = [
            tf.convert_to_tensor(self.experimental_local_results(gradient)[0])
            for gradient, _ in grads_and_vars
        ]
        # The statistics as this step's forward pass left them: the worker pushes the change.
        statistics = [v.value for v in self.worker.statistics]
        values = [tf.convert_to_tensor(self.experimental_local_results(v)[0]) for v in statistics]
        # Backpropagation produces the later layers' gradients first: they are written
        # ahead, while it computes the others, and only the rest wait for the last one.
        split = len(trained) - ahead_count(len(trained))
        # The weights come back in the order the gradients went out.
        variables = trained[split:] + trained[:split] + statistics
        # Whether the step was skipped comes back under loss scaling, and the servers'
        # iteration count where the worker pushes the rate.
        reported = [tf.bool] if self._reporting_skipped else []
        counted = [tf.int64] if rate_from_worker else []
        # The weights come back in one array where they share a dtype (see `worker.packed`).
        layout = self.worker.layout if self.worker.layout.dtype is not None else None
        returned = [tf.as_dtype(layout.dtype)] if layout is not None else [v.dtype for v in variables]
        with tf.device("/cpu:0"):
            written = []
            if split < len(trained):
                # An operation with no output (see `write_ahead`).
                written = [
                    tf.numpy_function(
                        functools.partial(self.worker.write_ahead, names[split:]),
                        gradients[split:],
                        Tout=[],
                        stateful=True,
                    )
                ]
            with tf.control_dependencies(written):
                outputs = tf.numpy_function(
                    functools.partial(
                        self.worker.push_pull,
                        names[:split] + tuple(v.path for v in self.worker.statistics),
                        skip_update=skip_update,
                        report_skipped=self._reporting_skipped,
                        rate_from_worker=rate_from_worker,
                        rate_to_relay=learning_rate is not None and not rate_from_worker,
                        layout=layout,
                    ),
                    [self._scalars(learning_rate), *gradients[:split], *values],
                    Tout=[*returned, *reported, *counted],
                    stateful=True,
                )
            if reported:
                self._update_skipped.assign(outputs[len(returned)])
            iterations = outputs[len(returned) + len(reported)] if counted else None
            if iterations is not None:
                iterations.set_shape([])
            if layout is None:
                weights = outputs[: len(variables)]
            else:
                paths = names[split:] + names[:split] + tuple(v.path for v in self.worker.statistics)
                weights = _unpacked(outputs[0], layout, paths, [v.shape for v in variables])
        for variable, weight in zip(variables, weights):
            weight.set_shape(variable.shape)
            self.extended.update(variable, _assign, args=(weight,), group=False)
        return iterations

    def update_skipped(self) -> tf.Tensor:
        """Whether the group step of the last `apply_through_server` traced under
        `reporting_skipped` skipped its update: a member's loss-scaled gradients
        overflowed, this worker's or another's."""
        return self._update_skipped.read_value()

    @contextlib.contextmanager
    def reporting_skipped(self) -> Iterator[None]:
        """The steps `apply_through_server` traces meanwhile set `update_skipped`: loss
        scaling reads it. Others leave it out (one array less from the exchange)."""
        self._reporting_skipped = True
        try:
            yield
        finally:
            self._reporting_skipped = False

    def _scalars(self, learning_rate: tf.Tensor | None) -> tf.Tensor:
        """The sums of Keras' loss tracker (losses, examples), which the train step has
        updated with this step's loss before it applies the gradients: the worker pushes
        the step's loss with them; then `learning_rate`, if given."""
        tracker = self.worker.loss_tracker
        if tracker is None:
            sums = [tf.constant(0.0, tf.float64)] * 2
        else:
            sums = [
                tf.add_n([tf.cast(part, tf.float64) for part in self.experimental_local_results(variable.value)])
                for variable in (tracker.total, tracker.count)
            ]
        # Every replica evaluated the same rate.
        rate = [] if learning_rate is None else [tf.cast(self.experimental_local_results(learning_rate)[0], tf.float64)]
        return tf.stack([*sums, *rate])


def ahead_count(trained: int) -> int:
    """How many of a step's `trained` variables (in the model's order) have their
    gradients written ahead of the push: the later half."""
    return trained // 2


def _unpacked(
    packed: tf.Tensor, layout: BufferLayout, paths: tuple[str, ...], shapes: list[tf.TensorShape]
) -> list[tf.Tensor]:
    """The variables `paths`, of `shapes`, in an array of `layout`."""
    packed.set_shape([layout.elements])
    return [tf.reshape(packed[layout.span_of(path)], shape) for path, shape in zip(paths, shapes)]


def _assign(variable: tf.Variable, value: tf.Tensor) -> tf.Operation:
    return variable.assign(value)


def unmirrored_variable(initial: tf.Tensor, shape: tf.TensorShape) -> tf.Variable:
    # `tf.Variable` goes through the variable creators of the strategy in scope (a user
    # may call `fit` inside it); a ResourceVariable made directly is a plain one.
    return resource_variable_ops.ResourceVariable(initial, shape=shape, trainable=False)
