"""One worker process's membership in the cluster: joining, the first weights, every
group step's push and pull, and the end of training."""

import logging
import time
from dataclasses import dataclass

import keras
import numpy as np

from omnikeras.parameter_server import Hyperparameters, ParameterServerClient, PushResult
from omnikeras.config import WorkerConfig

logger = logging.getLogger(__name__)

_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class GroupPlace:
    """Where a worker's data comes from: its group reads every `num_groups`-th batch,
    starting at `group`, and member `i` takes the rows between `boundaries[i]` and
    `boundaries[i + 1]` (fractions of the batch), in proportion to its throughput."""

    group: int
    num_groups: int
    members: tuple[int, ...]
    boundaries: tuple[float, ...]
    member_index: int

    @property
    def start(self) -> float:
        return self.boundaries[self.member_index]

    @property
    def stop(self) -> float:
        return self.boundaries[self.member_index + 1]


class ClusterWorker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.client = ParameterServerClient(
            list(config.parameter_servers), token=config.token, root_cert=config.root_cert
        )
        self.step = 0
        self.names: list[str] = []
        self.example_count = 1
        self.last_push: PushResult | None = None

    # Joining ------------------------------------------------------------------------------

    def join(self) -> GroupPlace:
        """Registers, waits for every worker to join, and returns this worker's place."""
        self.client.register(worker_id=self.config.worker_id)
        deadline = time.monotonic() + self.config.startup_timeout
        while True:
            groups = self.client.stats()[0].groups
            joined = sum(len(g.members) for g in groups)
            if joined >= self.config.num_workers:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {joined} of {self.config.num_workers} workers joined within "
                    f"{self.config.startup_timeout:.0f} s"
                )
            time.sleep(_POLL_SECONDS)
        mine = next(g for g in groups if self.config.worker_id in g.members)
        members = tuple(sorted(mine.members))
        throughputs = np.array([self.config.throughput_of(m) for m in members])
        boundaries = np.concatenate([[0.0], np.cumsum(throughputs) / throughputs.sum()])
        boundaries[-1] = 1.0
        place = GroupPlace(
            group=mine.group,
            num_groups=len(groups),
            members=members,
            boundaries=tuple(float(b) for b in boundaries),
            member_index=members.index(self.config.worker_id),
        )
        logger.info(
            "worker %d joined group %d of %d with members %s, taking %.0f%% of each batch",
            self.config.worker_id, place.group, place.num_groups, list(members), 100 * (place.stop - place.start),
        )
        return place

    def start(self, model: keras.Model, batch_share: int) -> None:
        """Gives every worker the same first weights: the chief's, or the server's if it
        already holds some (a restored checkpoint, or an earlier `fit`)."""
        self.names = [v.path for v in model.trainable_variables]
        self.example_count = max(batch_share, 1)
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
        result, pulled = self.client.push_pull(
            dict(zip(self.names, gradients)), step=self.step, example_count=self.example_count
        )
        self.last_push = result
        return [pulled.weights[name] for name in self.names]

    @property
    def stop_requested(self) -> bool:
        return self.last_push is not None and self.last_push.stop_requested

    # Finishing ----------------------------------------------------------------------------

    def finish(self, model: keras.Model) -> None:
        """Leaves the cluster, waits for the others, and takes the server's final weights.

        The chief ends training for everyone: the others stop at their next step.
        """
        if self.config.is_chief:
            self.client.request_stop()
        self.client.deregister()
        deadline = time.monotonic() + self.config.finish_timeout
        while any(g.members for g in self.client.stats()[0].groups):
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
    learning_rate = optimizer.learning_rate
    return Hyperparameters(
        learning_rate=float(keras.ops.convert_to_numpy(learning_rate)),
        momentum=float(optimizer.momentum),
        nesterov=bool(optimizer.nesterov),
    )
