"""One worker process's membership in the cluster: joining, the first weights, every
group step's push and pull, a regrouping while training runs, and the end of training."""

import logging
import time
from typing import Any

import grpc
import keras
import numpy as np

from omnikeras.config import WorkerConfig
from omnikeras.parameter_server import Hyperparameters, ParameterServerClient, PushResult
from omnikeras.strategy import data
from omnikeras.strategy.place import GroupPlace

logger = logging.getLogger(__name__)

_POLL_SECONDS = 0.1
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
        self.placement = data.DataPlacement()
        self.place: GroupPlace | None = None
        # A new place found during a step waits for `update_placement`: TensorFlow must
        # not be called from inside the step's numpy_function.
        self._placement_stale = False
        self.batch_size = 32
        self.example_count = 1
        self.step = 0
        self.names: list[str] = []
        self.last_push: PushResult | None = None
        self.rejected_steps = 0
        self._layout_version = -1
        # Training examples in `fit`'s data (None for a dataset of unknown length), and the
        # data itself, whose first examples make the probe batch.
        self.examples: int | None = None
        self._data: tuple[Any, Any, Any] = (None, None, None)

    def remember_data(self, x: Any, y: Any, sample_weight: Any) -> None:
        self._data = (x, y, sample_weight)
        self.examples = data.example_count(x)

    def probe(self, count: int) -> tuple[Any, Any, Any]:
        """The first `count` examples of the training data: the same batch every time."""
        return data.first_examples(*self._data, count)

    # Joining ------------------------------------------------------------------------------

    def join(self, batch_size: int) -> GroupPlace:
        """Registers, waits for every worker to join, and takes this worker's place."""
        self.client.register(worker_id=self.config.worker_id)
        self.batch_size = batch_size
        deadline = time.monotonic() + self.config.startup_timeout
        while (joined := self._workers_joined()) < self.config.num_workers:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {joined} of {self.config.num_workers} workers joined within "
                    f"{self.config.startup_timeout:.0f} s"
                )
            time.sleep(_POLL_SECONDS)
        place = self._take_place()
        self.update_placement()
        return place

    def start(self, model: keras.Model) -> None:
        """Gives every worker the same first weights: the chief's, or the server's if it
        already holds some (a restored checkpoint, or an earlier `fit`)."""
        self.names = [v.path for v in model.trainable_variables]
        if self.config.is_chief:
            weights = {v.path: keras.ops.convert_to_numpy(v) for v in model.trainable_variables}
            if self.client.init_model(weights, _hyperparameters(model.optimizer)):
                return
        pulled = self.client.pull(wait_for_model=self.config.startup_timeout)
        self.assign(model, pulled.weights)

    # Training -----------------------------------------------------------------------------

    def push_pull(self, *gradients: np.ndarray) -> list[np.ndarray]:
        """One group step: this worker's gradients out, the group step's weights back."""
        self.step += 1
        try:
            result, pulled = self.client.push_pull(
                dict(zip(self.names, gradients)), step=self.step, example_count=self.example_count
            )
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.ABORTED:
                # The weights were restored under this gradient (a tuning trial began).
                return self._pull_current()
            if error.code() != grpc.StatusCode.INVALID_ARGUMENT or "NaN or Inf" not in (error.details() or ""):
                raise
            return self._skip_step()
        self.rejected_steps = 0
        self.last_push = result
        if result.layout_version != self._layout_version:
            self._layout_version = result.layout_version
            self._take_place()
        return [pulled.weights[name] for name in self.names]

    @property
    def stop_requested(self) -> bool:
        return self.last_push is not None and self.last_push.stop_requested

    def _skip_step(self) -> list[np.ndarray]:
        """The server refused this step's NaN or Inf gradients: carry on from its weights."""
        self.rejected_steps += 1
        if self.rejected_steps > MAX_REJECTED_STEPS:
            raise FloatingPointError(
                f"the gradients were NaN or Inf for {self.rejected_steps} steps in a row: "
                "training diverged; lower the learning rate"
            )
        return self._pull_current()

    def _pull_current(self) -> list[np.ndarray]:
        weights = self.client.pull().weights
        return [weights[name] for name in self.names]

    def update_placement(self) -> None:
        """Hands the newest place to the input pipeline; called between steps."""
        if self._placement_stale and self.place is not None:
            self.placement.update(self.place)
            self._placement_stale = False

    def _take_place(self) -> GroupPlace:
        groups = self.client.stats()[0].groups
        place = GroupPlace.of(self.config.worker_id, groups, self.config.throughput_of)
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
        self._placement_stale = True
        self.example_count = int(place.rows_per_member(self.batch_size)[place.member_index])
        return place

    def _workers_joined(self) -> int:
        return sum(len(g.members) for g in self.client.stats()[0].groups)

    # Finishing ----------------------------------------------------------------------------

    def finish(self, model: keras.Model) -> None:
        """Leaves the cluster, waits for the others, and takes the server's final weights.

        The chief ends training for everyone: the others stop at their next step.
        """
        if self.config.is_chief:
            self.client.request_stop()
        self.client.deregister()
        deadline = time.monotonic() + self.config.finish_timeout
        while self._workers_joined():
            if time.monotonic() > deadline:
                logger.warning(
                    "other workers still train after %.0f s; taking the weights as they are",
                    self.config.finish_timeout,
                )
                break
            time.sleep(_POLL_SECONDS)
        self.assign(model, self.client.pull().weights)

    def assign(self, model: keras.Model, weights: dict[str, np.ndarray]) -> None:
        for variable in model.trainable_variables:
            variable.assign(weights[variable.path])


def _hyperparameters(optimizer: keras.optimizers.SGD) -> Hyperparameters:
    # The optimizer keeps its rate in float32: 0.01 reads back as 0.009999999776. Seven
    # significant digits give back the number the user wrote.
    learning_rate = float(f"{float(keras.ops.convert_to_numpy(optimizer.learning_rate)):.7g}")
    return Hyperparameters(
        learning_rate=learning_rate,
        momentum=float(optimizer.momentum),
        nesterov=bool(optimizer.nesterov),
    )
