"""One worker process's membership in the cluster: joining, the first weights, every
group step's push and pull, a regrouping while training runs, and the end of training."""

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
import keras
import numpy as np
import tensorflow as tf

from omnikeras.config import WorkerConfig
from omnikeras.parameter_server import GroupLayout, Hyperparameters, ParameterServerClient, PushResult, Stats
from omnikeras.parameter_server.buffer_layout import BufferLayout, FlatArrays
from omnikeras.parameter_server.errors import Refusal, refusal_of
from omnikeras.parameter_server.tensors import SUPPORTED_DTYPES, VariableSpec
from omnikeras.strategy import data
from omnikeras.strategy.place import GroupPlace
from omnikeras.strategy.update_rule import (
    as_written,
    model_statistics,
    rate_from_worker,
    server_update_rule,
    step_counter,
)

logger = logging.getLogger(__name__)

_POLL_SECONDS = 0.1
_STILL_TRAINING = "other workers still train after %.0f s; taking the weights as they are"
# Consecutive steps whose gradients the server refused as NaN or Inf before training
# stops: a tuner restores sane weights long before that.
MAX_REJECTED_STEPS = 10


class ClusterWorker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.client = ParameterServerClient(
            list(config.parameter_servers),
            token=config.token,
            root_cert=config.root_cert,
            shared_memory=config.shared_memory,
        )
        self.place: GroupPlace | None = None
        # The training batches; the one this worker's group reads next, as the server
        # handed it out, and the members that share it; this worker's share of it, which
        # the next step reads.
        self.source: data.BatchSource | None = None
        self.next_batch = 0
        self._next_members: tuple[int, ...] = ()
        self._share: data.Share | None = None
        # The share read ahead for the batch the next step will likely take, with that
        # batch and the place it was read for; the feed that makes the steps' tensors;
        # and how far apart this worker's last two batches were.
        self._share_ahead: tuple[int, GroupPlace, data.Share] | None = None
        self._feed: data.ShareFeed | None = None
        self._batch_stride = 1
        # The dataset `fit` is given for the shares (`data.stand_in`); where its epochs are
        # passes over the data, the batches in a pass, and the pass the epoch under way
        # began in.
        self.shares: tf.data.Dataset | None = None
        self._batches_per_epoch: int | None = None
        self._epoch_pass = 0
        self.batch_size = 32
        # Rows of the last pushed step's share: its weight in its group's mean.
        self.example_count = 1
        self.step = 0
        # What the server holds: the trainable variables, then the statistics.
        self.names: list[str] = []
        self._paths: dict[int, str] = {}
        self.statistics: list[keras.Variable] = []
        # The statistics as last pulled: a push sends the change since.
        self._pulled_statistics: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        # The held variables laid out as a shared-memory segment lays them out: the
        # weights come back to the train step in one array of this layout (`push_pull`).
        self.layout = BufferLayout.of({})
        self.hyperparameters = Hyperparameters()
        # The chief's learning rate as last handed to the server (`relay_learning_rate`).
        self.relayed_learning_rate: float | None = None
        # The optimizer of this process's last `fit`: a later one compiled since starts
        # afresh on the server too.
        self._optimizer: keras.optimizers.Optimizer | None = None
        self.last_push: PushResult | None = None
        # The servers' iteration count as the last group step left it.
        self.server_iterations = 0
        # Keras' loss tracker, and its sums at the last push: their change is the step's loss.
        self.loss_tracker: keras.metrics.Mean | None = None
        self._loss_sums = (0.0, 0.0)
        self.rejected_steps = 0
        # The variables whose gradients this step wrote ahead of its push.
        self._ahead: tuple[str, ...] = ()
        # What ended the last exchange with the servers, if it failed.
        self.failure: Exception | None = None
        # Inside `fit`, whose steps alone exchange with the servers.
        self.fitting = False
        # The chief's weights on the servers as its last `fit` left them (`server_weights`),
        # before the callbacks' `on_train_end`.
        self.weights_at_end: dict[str, np.ndarray] | None = None
        # Set when this worker comes back after the chief ended training.
        self._training_over = False
        # Training examples in `fit`'s data (None for a dataset of unknown length), and the
        # data itself, whose first examples make the probe batch.
        self.examples: int | None = None
        self._data: tuple[Any, Any, Any] = (None, None, None)

    def remember_data(self, x: Any, y: Any, sample_weight: Any) -> None:
        self._data = (x, y, sample_weight)
        self.examples = data.example_count(x)

    def read_from(self, source: data.BatchSource, epochs_by_pass: bool) -> tf.data.Dataset:
        """The dataset `fit` is given: the strategy puts this worker's share of each batch
        its group reads in its place (`feed`), chosen as each step's reply names the next
        batch. With `epochs_by_pass`, each epoch ends where a pass over the data ends."""
        self.source = source
        self._share_ahead = None
        self._choose_share()
        self._batches_per_epoch = source.batches_per_pass if epochs_by_pass else None
        # Keras reads a first element to build the model before the first epoch begins.
        self.begin_epoch()
        self.shares = data.stand_in(source.element_spec)
        return self.shares

    def feed(self, strategy: tf.distribute.Strategy) -> data.ShareFeed:
        """The shares, as the train step reads them (see `read_from`)."""
        assert self.source is not None, "read_from chooses the first share"
        self._feed = data.ShareFeed(
            self.source.element_spec, lambda: None if self.epoch_over() else self._share, strategy
        )
        return self._feed

    def begin_epoch(self) -> None:
        """Notes the pass over the data that the epoch beginning now begins in."""
        if self._batches_per_epoch is not None and self._share is not None and self._share.batch >= 0:
            self._epoch_pass = self._share.batch // self._batches_per_epoch

    def wait_for_the_chief(self, model: keras.Model) -> None:
        """Where epochs are passes over the data, a worker other than the chief begins an
        epoch once the chief has read in its pass, or ended its training. The others then
        wait while the chief starts up or validates at an epoch's end, rather than read
        on into passes the fit did not ask for: the chief's epochs, whose History and
        callbacks the user sees, are the passes over the data. After a wait, the worker
        takes the weights (and the servers' count, where it evaluates the learning rate)
        as the others' updates left them meanwhile; where the chief ended its training
        first, this worker's pass lies past the fit's: it stops, pushing nothing more."""
        if self.config.is_chief or self._batches_per_epoch is None or self._share is None or self._share.batch < 0:
            return
        first = self._epoch_pass * self._batches_per_epoch

        def begun(stats: Stats) -> bool:
            return stats.chief_batch >= first or stats.stop_requested

        if begun(self.client.stats()[0]):
            return
        stats = self._wait_until(
            begun, f"the chief has not begun pass {self._epoch_pass} after %.0f s; beginning it without the chief"
        )
        if stats is not None and stats.chief_batch < first:
            self._training_over = True
            return
        # Its next gradient would be computed on weights as stale as the wait was long.
        self.assign(model, self.client.pull().weights)
        if rate_from_worker(model.optimizer):
            self.server_iterations = self.client.describe().iterations
            step_counter(model.optimizer).assign(self.server_iterations)

    def epoch_over(self) -> bool:
        """Whether the share the next step would read lies past the epoch under way: past
        the data's end, or, where epochs are passes over the data, in a later pass."""
        if self._share is None:
            return False
        if self._share.batch < 0:
            return True
        return self._batches_per_epoch is not None and self._share.batch // self._batches_per_epoch > self._epoch_pass

    @property
    def reading(self) -> int | None:
        """The batch the step under way reads (from a reply on, the batch the next step
        will read)."""
        return None if self._share is None else self._share.batch

    @property
    def steps_per_epoch(self) -> int | None:
        """This worker's steps in a pass over the data, in the present layout."""
        if self.source is None or self.source.batches_per_pass is None or self.place is None:
            return None
        workers = range(1, self.config.num_workers + 1)
        return math.ceil(self.source.batches_per_pass * self.place.part_of_batches(self.config.throughput_of, workers))

    def _choose_share(self) -> None:
        """Takes this worker's share of the batch its group reads next: the one read
        ahead, where it was read for this batch and place."""
        assert self.source is not None
        place = self._place_in_next_batch()
        if self._share is not None and self.next_batch > self._share.batch >= 0:
            self._batch_stride = self.next_batch - self._share.batch
        ahead, self._share_ahead = self._share_ahead, None
        if ahead is not None and ahead[:2] == (self.next_batch, place):
            self._share = ahead[2]
            return
        try:
            self._share = data.share_of(self.source, self.next_batch, place)
        except data.NoMoreBatches:
            self._share = data.Share.end()

    def _read_share_ahead(self) -> None:
        """While the servers work on this step's update, reads the share of the batch
        the next step will likely take (as far on as the last two were apart, in the same
        place) and makes its tensors, where the source reads freely: they are ready when
        the reply names that batch, and dropped where it names another."""
        share, place = self._share, self.place
        if self.source is None or not self.source.reads_freely or share is None or share.batch < 0 or place is None:
            return
        batch = share.batch + self._batch_stride
        ahead = data.share_of(self.source, batch, place)
        if self._feed is not None:
            self._feed.prepare(ahead)
        self._share_ahead = (batch, place, ahead)

    def _place_in_next_batch(self) -> GroupPlace:
        """This worker's place among the members that share the next batch: they were its
        group when the server handed the batch out, which a regrouping since then does not
        change. (A worker that came back after the batch was handed out shares it as a
        member of its group now.)"""
        assert self.place is not None
        if self.config.worker_id not in self._next_members:
            return self.place
        if self.place.members != self._next_members:
            # Only after a change of members: every other step shares as the group does.
            return GroupPlace.among(
                self.config.worker_id, self._next_members, self.config.throughput_of, self.place.group, self.place.num_groups
            )
        return self.place

    def probe(self, count: int) -> tuple[Any, Any, Any]:
        """The first `count` examples of the training data: the same batch every time."""
        return data.first_examples(*self._data, count)

    # Joining ------------------------------------------------------------------------------

    def join(self, batch_size: int) -> GroupPlace:
        """Registers, waits for every worker to join, and takes this worker's place."""
        self.client.register(worker_id=self.config.worker_id, chief=self.config.is_chief)
        self.batch_size = batch_size
        deadline = time.monotonic() + self.config.startup_timeout
        while not self.config.rejoining and (joined := self.client.stats()[0].workers) < self.config.num_workers:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {joined} of {self.config.num_workers} workers joined within "
                    f"{self.config.startup_timeout:.0f} s"
                )
            time.sleep(_POLL_SECONDS)
        if self.config.rejoining and self._chief_left():
            logger.warning("worker %d: training ended before it came back; it stops", self.config.worker_id)
            self._training_over = True
        return self._take_place(with_next_batch=True)

    def start(self, model: keras.Model) -> None:
        """Gives every worker the same first weights: the chief's, or the server's if it
        already holds some (a restored checkpoint, or an earlier `fit`).

        The chief's later `fit` sets the server's rule from the model's optimizer as it is
        now (recompiled, or with other settings), which starts afresh where it is a new
        one, as Keras' newly compiled optimizer does. Where that `fit` trains other
        variables (a layer unfrozen for fine-tuning, another model), the chief's replace
        the servers', and the others wait for them. A first `fit` finding a model on the
        server (a restarted chief) leaves the rule and state as they are.

        The frozen weights (a frozen layer's: see `_share_frozen`) are the chief's on every
        worker too.
        """
        earlier_names = set(self.names)
        self.statistics = model_statistics(model)
        self.loss_tracker = getattr(model, "_loss_tracker", None)
        self.server_iterations = int(keras.ops.convert_to_numpy(step_counter(model.optimizer)))
        held = self._held(model)
        self.names = [v.path for v in held]
        # Keras' optimizer hands the strategy its variables' backend values.
        self._paths = {id(v.value): v.path for v in held}
        self.shapes = {v.path: (tuple(v.shape), np.dtype(v.dtype)) for v in held}
        self.layout = BufferLayout.of({p: VariableSpec(p, dtype, shape) for p, (shape, dtype) in self.shapes.items()})
        rule = server_update_rule(model.optimizer, model.trainable_variables, self.statistics)
        clipping = rule.clipping
        if clipping.global_clipnorm and not clipping.clipnorm and len(self.client.shards) > 1:
            raise ValueError(
                "global_clipnorm with gradient_accumulation_steps needs the norm of every gradient, which no "
                f"one of the {len(self.client.shards)} parameter server shards holds: use clipnorm, or one shard"
            )
        earlier, self._optimizer = self._optimizer, model.optimizer
        fresh_optimizer = model.optimizer is not earlier
        if not fresh_optimizer:
            # The train step that an earlier `fit` traced is not traced again until the
            # model is compiled again: keep the variables it found without gradients
            # (`expect_gradients`), and those it did not know, as Keras leaves them.
            without = self.hyperparameters.no_weight_decay | (set(self.names) - earlier_names)
            rule = dataclasses.replace(rule, no_weight_decay=rule.no_weight_decay | without)
        self.hyperparameters = dataclasses.replace(rule, compensate_asynchrony=self.config.compensate_asynchrony)
        others = self._others_held(later_fit=earlier is not None)
        if self.config.is_chief:
            weights = {v.path: keras.ops.convert_to_numpy(v) for v in held}
            if others:
                logger.info("worker %d: this fit trains other variables (%s): they replace the servers'", self.config.worker_id, others)
                self.client.replace_model(weights, self.hyperparameters, fresh_optimizer=fresh_optimizer)
            elif self.client.init_model(weights, self.hyperparameters):
                self._remember_statistics(weights)
                self._share_frozen(model, put=True)
                return
            elif earlier is not None:
                self.client.set_hyperparameters(self.hyperparameters, fresh_optimizer=fresh_optimizer)
        elif others:
            self._wait_for_variables()
        pulled = self.client.pull(wait_for_model=self.config.startup_timeout)
        self.assign(model, pulled.weights)
        if rate_from_worker(model.optimizer):
            # The rate this worker evaluates follows the servers' count from the first step
            # (a chief resuming, a later fit, a worker joining late).
            self.server_iterations = self.client.describe().iterations
            step_counter(model.optimizer).assign(self.server_iterations)
        # A chief's first fit that found a model on the servers (resumed) takes theirs.
        self._share_frozen(model, put=self.config.is_chief and (bool(others) or earlier is not None))

    def _share_frozen(self, model: keras.Model, put: bool) -> None:
        """Puts the model's frozen weights (its non-trainable weights other than the
        statistics: a frozen layer's) on the servers, or takes those there: no update
        changes them, so they are not exchanged at each step, but every worker must start
        from the chief's (its own may be initialised otherwise: a random layer frozen).

        A worker other than the chief waits for the chief's (as many, of the same shapes);
        a chief that finds none such on the servers puts its own.
        """
        statistics = {v.path for v in self.statistics}
        frozen = {
            v.path: v
            for v in model.non_trainable_weights
            if v.path not in statistics and np.dtype(v.dtype).name in SUPPORTED_DTYPES
        }
        if not frozen:
            return
        wanted = {path: (tuple(v.shape), np.dtype(v.dtype)) for path, v in frozen.items()}
        deadline = time.monotonic() + self.config.startup_timeout
        while not put:
            held = self.client.frozen_weights()
            if {path: (w.shape, w.dtype) for path, w in held.items()} == wanted:
                for path, variable in frozen.items():
                    variable.assign(held[path])
                return
            if self.config.is_chief:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the chief did not put this fit's frozen weights on the parameter servers within "
                    f"{self.config.startup_timeout:.0f} s: every worker's script must freeze the same layers"
                )
            time.sleep(_POLL_SECONDS)
        self.client.set_frozen_weights({path: keras.ops.convert_to_numpy(v) for path, v in frozen.items()})

    def _others_held(self, later_fit: bool) -> str:
        """How the variables the servers hold differ from those this `fit` trains ("" where
        they hold none, or the same). Only a later `fit` of this process replaces them (or
        waits for the chief to): a first one finding others would lose what they learned,
        the servers having resumed another stage of the script or another model."""
        difference = self._difference()
        if difference and not later_fit:
            raise ValueError(
                f"this fit trains other variables than the parameter servers hold ({difference}): they hold "
                "another model's, or those of a later fit of this script, resumed from a checkpoint or kept "
                "while this worker restarted. Launch afresh (another --log-dir) to train this model from "
                "the start, or load the weights to resume into the model that fit trains"
            )
        return difference

    def _difference(self) -> str:
        described = self.client.describe()
        if not described.model_initialized:
            return ""
        held = {spec.name: (tuple(spec.shape), np.dtype(spec.dtype)) for spec in described.variables}
        if held == self.shapes:
            return ""
        new = sorted(self.shapes.keys() - held.keys())
        gone = sorted(held.keys() - self.shapes.keys())
        changed = sorted(n for n in self.shapes.keys() & held.keys() if self.shapes[n] != held[n])
        return f"new: {new[:5]}, gone: {gone[:5]}, another shape or dtype: {changed[:5]}"

    def _wait_for_variables(self) -> None:
        """Waits for the chief to put this `fit`'s variables on the servers."""
        deadline = time.monotonic() + self.config.startup_timeout
        while difference := self._difference():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the chief did not put this fit's variables on the parameter servers within "
                    f"{self.config.startup_timeout:.0f} s ({difference}): every worker's script must "
                    "train the same variables in each fit"
                )
            time.sleep(_POLL_SECONDS)

    # Training -----------------------------------------------------------------------------

    def path_of(self, variable: Any) -> str:
        """The path of the model variable whose backend value `variable` is."""
        path = self._paths.get(id(variable))
        if path is None:
            raise ValueError(f"a gradient for {variable.name}, which is not one of the model's variables")
        return path

    def check_applying(self, optimizer: keras.optimizers.Optimizer) -> None:
        """Called as the train step is traced, with the optimizer that applies its
        gradients: the servers apply the model's, and only once a step of `fit`."""
        if not self.fitting:
            raise ValueError(
                "GroupedAsyncStrategy trains through model.fit, whose steps exchange with the parameter servers: "
                "gradients applied outside it (a custom training loop's apply_gradients) cannot reach them. "
                "Call model.fit (a train_step of your own is fine), or train outside the strategy's scope"
            )
        compiled = self._optimizer
        if optimizer is compiled or optimizer is getattr(compiled, "inner_optimizer", None):
            return
        raise ValueError(
            f"the train step applies gradients with an optimizer other than the model's ({optimizer.name}, "
            f"not {getattr(compiled, 'name', None)}): the parameter servers apply the model's one optimizer "
            "(model.optimizer), once a step, so a train_step with optimizers of its own (a GAN's) cannot train "
            "under GroupedAsyncStrategy. Train such a model outside the strategy's scope"
        )

    def expect_gradients(self, names: Sequence[str]) -> None:
        """Called as the train step is traced, with the variables Keras has gradients for.

        The others get a gradient of zeros, which leaves them where they are, as Keras
        leaves them; Keras does not decay them either, so neither does the server.
        """
        unknown = set(names) - set(self.names)
        if unknown:
            raise ValueError(f"gradients for variables the cluster does not hold: {sorted(unknown)}")
        trainable = set(self.names) - self.hyperparameters.statistics
        without = trainable - set(names) - self.hyperparameters.no_weight_decay
        if any(self.hyperparameters.weight_decay_of(name) for name in without):
            self.change_update_rule(no_weight_decay=self.hyperparameters.no_weight_decay | without)

    def rule_in_force(self) -> dict[str, float]:
        """The first server's rule at its next update, for `logs`: the explicit momentum
        and learning rate in force (compensated, with more than one group), the momentum
        the staleness adds, the cap's halvings and the share of the compiled step it
        allows."""
        stats = self.client.stats()[0]
        return {
            "explicit_momentum": stats.momentum_in_force,
            "implicit_momentum": stats.implicit_momentum,
            "learning_rate_in_force": stats.learning_rate_in_force,
            "step_backoffs": stats.step_backoffs,
            "step_share": stats.step_share,
        }

    def change_update_rule(self, **changes: Any) -> None:
        """Changes the server's update rule, keeping what `changes` does not name."""
        self.hyperparameters = dataclasses.replace(self.hyperparameters, **changes)
        self.client.set_hyperparameters(self.hyperparameters)

    def relay_learning_rate(self, rate: float) -> None:
        """Hands the server the chief's learning rate where a callback changed it since
        the one last relayed."""
        if rate != self.relayed_learning_rate:
            self.relayed_learning_rate = rate
            self.change_update_rule(learning_rate=rate)

    def write_ahead(self, names: Sequence[str], *gradients: np.ndarray) -> list[np.ndarray]:
        """The first part of a group step: the gradients backpropagation produces first
        (of the variables `names`), handed to the client while the step computes the
        rest. The `push_pull` that follows sends them and returns their weights first.

        Returns no array: TensorFlow converts each array a `numpy_function` returns in
        Python, 60 µs a step for the one this returned, cold between steps.

        An error is kept in `failure` as well: TensorFlow hands it on wrapped in its own.
        """
        self._ahead = tuple(names)
        if not self._training_over:
            try:
                self.client.write_ahead(dict(zip(names, gradients)))
            except Exception as error:
                self.failure = error
                raise
        return []

    def push_pull(
        self,
        names: Sequence[str],
        scalars: np.ndarray,
        *gradients: np.ndarray,
        skip_update: bool = False,
        report_skipped: bool = False,
        rate_from_worker: bool = False,
        rate_to_relay: bool = False,
        layout: BufferLayout | None = None,
    ) -> list[np.ndarray]:
        """One group step: this worker's gradients (of the variables `names`, by path) and
        the step's loss out, the group step's weights of the variables written ahead
        (`write_ahead`) and of `names` back, and, with `report_skipped` (under loss
        scaling), whether the step's update was skipped; the reply names the next batch,
        whose share this worker's next step reads (`feed`). `scalars` are the sums of
        Keras' loss tracker (losses and examples so far).

        With a `layout` (of one dtype), the weights come back as one array of it (`packed`)
        rather than one array each.

        With `skip_update` (the step's loss-scaled gradients overflowed), the group step
        updates no weight; it is skipped too where another member's overflowed.

        With `rate_from_worker` (a learning rate only the worker can evaluate), the step's
        learning rate follows the sums in `scalars` and goes out with the gradients, and
        the server's iteration count after the group step comes back after whether it
        was skipped: Keras evaluates the next step's rate there. With `rate_to_relay`
        (the optimizer's own rate, which a callback may set between steps), the rate
        follows the sums too, and the chief relays it before the push where it changed
        (`relay_learning_rate`): read inside the step, it costs one float, where an eager
        read before each step cost about 0.25 ms of a 6.6 ms step.

        An error is kept in `failure` as well: TensorFlow hands it on wrapped in its own.
        """
        assert self._share is not None, "read_from chooses the first share"
        self.example_count = self._share.rows
        ahead, self._ahead = self._ahead, ()
        loss = self._step_loss(float(scalars[0]), float(scalars[1]))
        learning_rate = float(scalars[2]) if rate_from_worker else None
        try:
            if rate_to_relay and self.config.is_chief and not self._training_over:
                self.relay_learning_rate(as_written(float(scalars[2])))
            weights, skipped = self._push_pull(ahead, names, gradients, loss, skip_update, learning_rate)
            self._remember_statistics(weights)
            self._choose_share()
            returned = [packed(weights, layout)] if layout is not None else [weights[n] for n in (*ahead, *names)]
        except Exception as error:
            self.failure = error
            raise
        # Only what the step reads: TensorFlow converts each array returned in Python.
        reported = [np.asarray(skipped)] if report_skipped else []
        iterations = [np.asarray(self.server_iterations, np.int64)] if rate_from_worker else []
        return [*returned, *reported, *iterations]

    def _step_loss(self, total: float, count: float) -> float | None:
        """This step's loss from the tracker's sums; None where their change is not this
        step's examples (the tracker was reset, or `evaluate` used it in between)."""
        last_total, last_count = self._loss_sums
        self._loss_sums = (total, count)
        if count < last_count:
            last_total, last_count = 0.0, 0.0
        if count - last_count != self.example_count:
            return None
        loss = (total - last_total) / self.example_count
        return loss if math.isfinite(loss) else None

    def _push_pull(
        self,
        ahead: Sequence[str],
        pushed_now: Sequence[str],
        gradients: Sequence[np.ndarray],
        loss: float | None,
        skip_update: bool,
        learning_rate: float | None = None,
    ) -> tuple[Mapping[str, np.ndarray], bool]:
        """The weights after the group step, of every variable the servers hold, and
        whether the step's update was skipped (where the push did not count, only this
        worker's own overflow says so)."""
        if self._training_over:
            return self.client.pull().weights, skip_update
        self.step += 1
        pushed = dict(zip(pushed_now, gradients))
        for name, pulled_value in self._pulled_statistics.items():
            pushed[name] = pushed[name] - pulled_value
        if len(ahead) + len(pushed) < len(self.names):
            written_ahead = set(ahead)
            for name in self.names:
                if name not in pushed and name not in written_ahead:
                    shape, dtype = self.shapes[name]
                    pushed[name] = np.zeros(shape, dtype)
        try:
            result, pulled = self.client.push_pull(
                pushed,
                step=self.step,
                example_count=self.example_count,
                batch=self.reading,
                loss=loss,
                skip_update=skip_update,
                learning_rate=learning_rate,
                while_waiting=self._read_share_ahead,
            )
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.ABORTED:
                # The weights were restored under this gradient (a tuning trial began):
                # the group may read another batch now.
                self._take_place(with_next_batch=True)
                return self.client.pull().weights, skip_update
            refusal = refusal_of(error)
            if refusal in (Refusal.DROPPED, Refusal.NOT_REGISTERED):
                return self._rejoin(error.details() or ""), skip_update
            if refusal != Refusal.NON_FINITE:
                raise
            return self._skip_step(), skip_update
        self.rejected_steps = 0
        self.last_push = result
        self.server_iterations = result.iterations
        self.next_batch, self._next_members = result.next_batch, result.next_members
        if result.layout is not None:
            self._settle(result.layout)
        return pulled.weights, result.update_skipped

    def _remember_statistics(self, weights: Mapping[str, np.ndarray]) -> None:
        # Copies: pulled arrays may be views that the next exchange overwrites.
        self._pulled_statistics = {v.path: np.array(weights[v.path]) for v in self.statistics}

    @property
    def stop_requested(self) -> bool:
        return self._training_over or (self.last_push is not None and self.last_push.stop_requested)

    def _skip_step(self) -> Mapping[str, np.ndarray]:
        """The server refused this step's NaN or Inf gradients: carry on from its weights."""
        self.rejected_steps += 1
        if self.rejected_steps > MAX_REJECTED_STEPS:
            raise FloatingPointError(
                f"the gradients were NaN or Inf for {self.rejected_steps} steps in a row: "
                "training diverged; lower the learning rate"
            )
        return self.client.pull().weights

    def _rejoin(self, reason: str) -> Mapping[str, np.ndarray]:
        """The server no longer counts this worker (it missed its group's deadline, or
        the server restarted and never knew it): register again under the same id, in
        the same group, and carry on from the newest weights. This step's gradient,
        computed on weights the server no longer has, is dropped."""
        seen = self.last_push.model_version if self.last_push is not None else 0
        server_restarted = bool(self.client.restarted_shards())
        self.client.register(worker_id=self.config.worker_id, chief=self.config.is_chief)
        pulled = self.client.pull(wait_for_model=self.config.startup_timeout)
        logger.warning(
            "worker %d: %s; registered again, carrying on from version %d",
            self.config.worker_id, reason, pulled.model_version,
        )
        if server_restarted:
            checkpoint = self.client.describe().resumed_from_version
            logger.warning(
                "the parameter server restarted from its checkpoint at version %d: the %d "
                "updates this worker saw after it (up to version %d) are lost",
                checkpoint, max(seen - checkpoint, 0), seen,
            )
        # (A restarted server knows no worker yet, the chief included, until they return.)
        if not server_restarted and self._chief_left():
            # Training ended while this worker was away: it stops, pushing nothing more.
            logger.warning("worker %d: training ended while it was away; it stops", self.config.worker_id)
            self._training_over = True
        self._take_place(with_next_batch=True)
        return pulled.weights

    def _chief_left(self) -> bool:
        """The chief has ended training: the server holds a model, and not the chief."""
        if self.config.is_chief or not self.client.describe().model_initialized:
            return False
        return all(self.config.chief_id not in g.members for g in self.client.stats()[0].groups)

    def _take_place(self, with_next_batch: bool = False) -> GroupPlace:
        """Looks up this worker's group and, `with_next_batch`, the batch it reads next
        (which a push's reply names otherwise)."""
        groups = self.client.stats()[0].groups
        place = self._settle(GroupLayout(0, tuple(g.members for g in groups)))
        if with_next_batch:
            mine = groups[place.group]
            self.next_batch, self._next_members = mine.next_batch, mine.next_members
        return place

    def _settle(self, layout: GroupLayout) -> GroupPlace:
        """Takes this worker's place in `layout`: its group, and its share of each batch."""
        place = GroupPlace.of(self.config.worker_id, layout, self.config.throughput_of)
        if place.min_batch_size() > self.batch_size:
            raise ValueError(
                f"a batch of {self.batch_size} cannot be shared by the {len(place.members)} "
                "members of a group: raise the batch size"
            )
        if place != self.place:
            logger.info(
                "worker %d: group %d of %d with members %s, %.0f%% of each batch",
                self.config.worker_id, place.group, place.num_groups, list(place.members),
                100 * (place.stop - place.start),
            )
        self.place = place
        return place

    # Finishing ----------------------------------------------------------------------------

    def finish(self, model: keras.Model, history: str = "", chosen: dict[str, np.ndarray] | None = None) -> str:
        """Leaves the cluster, waits for the others, and takes the server's final weights.

        The chief ends training for everyone, handing over its History as JSON
        (`history`): the others stop at their next step. Where a callback on the chief
        chose the weights training ends with (`chosen`, by path: `server_weights`), the
        chief puts them on the servers once the others have left, for every worker to
        take. Returns the chief's History as the server holds it ("" where the chief
        ended no training, or left none).
        """
        if self.config.is_chief:
            self.client.request_stop(history)
            if chosen is not None:
                # After the others' last steps, which would otherwise be applied on top.
                self._wait_for_workers(at_most=1)
                self.client.set_weights(chosen)
        ended = self.client.stats()[0].trainings_ended
        self.client.deregister()
        self._wait_for_end(ended)
        self.assign(model, self.client.pull().weights)
        return self.client.stats()[0].chief_history

    def server_weights(self, model: keras.Model) -> dict[str, np.ndarray]:
        """Copies of the values of `model`'s variables that live on the servers, by path."""
        return {v.path: keras.ops.convert_to_numpy(v) for v in self._held(model)}

    def _held(self, model: keras.Model) -> list[keras.Variable]:
        """`model`'s variables whose values live on the servers."""
        return [*model.trainable_variables, *self.statistics]

    def _wait_for_workers(self, at_most: int) -> None:
        self._wait_until(lambda stats: stats.workers <= at_most, _STILL_TRAINING)

    def _wait_for_end(self, ended: int) -> None:
        """Waits for the training this worker left to end: the last worker left, and the
        servers counted past `ended`. A next training may have begun since (a script's
        next `fit` on a worker that finished first): its workers do not count."""
        self._wait_until(
            lambda stats: stats.trainings_ended != ended or not any(g.members for g in stats.groups), _STILL_TRAINING
        )

    def _wait_until(self, done: Callable[[Stats], bool], given_up: str) -> Stats | None:
        """Polls the servers until `done`, and returns the stats that were; after
        `finish_timeout`, logs `given_up` (with the seconds for its %.0f) and returns
        None."""
        deadline = time.monotonic() + self.config.finish_timeout
        while not done(stats := self.client.stats()[0]):
            if time.monotonic() > deadline:
                logger.warning(given_up, self.config.finish_timeout)
                return None
            time.sleep(_POLL_SECONDS)
        return stats

    def assign(self, model: keras.Model, weights: dict[str, np.ndarray]) -> None:
        for variable in self._held(model):
            variable.assign(weights[variable.path])
        self._remember_statistics(weights)



def packed(weights: Mapping[str, np.ndarray], layout: BufferLayout) -> np.ndarray:
    """`weights` as one array of `layout`: the buffer they lie in where they are views of
    one laid out alike (a shared-memory segment's weights), else a new array they are
    copied into. The train step takes one array out of the exchange and slices it: one
    output per variable cost TensorFlow more than the slices (0.53 ms against 1.1 ms a
    step for 128 variables)."""
    region = weights.region_as(layout) if isinstance(weights, FlatArrays) else None
    if region is not None:
        return region
    assert layout.dtype is not None, "weights of several dtypes go out one array each"
    buffer = np.empty(layout.region_bytes, np.uint8)
    for name, view in layout.arrays(buffer).items():
        np.copyto(view, weights[name])
    return np.frombuffer(buffer, layout.dtype)
