"""The Python client of the parameter server: one worker's view of the (sharded) model."""

import dataclasses
import logging
import socket
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import TypeVar

import grpc
import numpy as np

from omnikeras.parameter_server import tensors
from omnikeras.parameter_server.placement import balance_by_bytes
from omnikeras.parameter_server.shard import ShardConnection
from omnikeras.parameter_server.shared_memory import available as shared_memory_available
from omnikeras.parameter_server.shared_memory_client import SharedMemoryChannel
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.parameter_server.values import Description, PullResult, PushResult, Registration, Stats
from omnikeras.v1 import parameter_server_pb2 as pb

_T = TypeVar("_T")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _ShardModel:
    """What `Describe` tells a client about one shard's part of the model."""

    specs: dict[str, tensors.VariableSpec]
    shared_memory_socket: str
    server_id: str


class ParameterServerClient:
    """Pushes gradients to and pulls weights from a parameter server, one or many shards.

    One client acts for one worker. It remembers the model version of the weights it last
    pulled from each shard and sends it with every push, so the server measures staleness
    without the caller keeping track. With several shard addresses, each variable lives on
    one shard (balanced by bytes) and every call fans out to the shards in parallel.

    `push_pull` with a shard on the same host goes through shared memory rather than
    gRPC, unless `shared_memory` is False; everything else, and every shard on another
    host, uses gRPC. The weights are the same either way.

    Args:
        addresses: `"host:port"` of each server shard, in the same order on every worker.
        token: Shared secret the servers expect; None (the default) sends none.
        root_cert: PEM file of the CA that signed the servers' TLS certificates; None (the
            default) connects without TLS.
        timeout: Deadline in seconds of each push or pull, group wait included. Defaults
            to 300.
        retry_seconds: How long a call keeps retrying while a server is UNAVAILABLE.
            Defaults to 30.
        shared_memory: Exchange gradients and weights with shards on this host through
            shared memory. Defaults to True.

    Example:

    >>> client = ParameterServerClient(["127.0.0.1:50051"])
    >>> worker = client.register()
    >>> client.init_model({"w": np.zeros(3, "float32")}, Hyperparameters(0.1))
    >>> reply = client.push_pull({"w": np.ones(3, "float32")}, step=1, example_count=32)
    """

    def __init__(
        self,
        addresses: list[str],
        token: str | None = None,
        root_cert: str | None = None,
        timeout: float = 300.0,
        retry_seconds: float = 30.0,
        shared_memory: bool = True,
    ) -> None:
        if not addresses:
            raise ValueError("at least one server address is needed")
        self.shards = [ShardConnection(a, token, root_cert, retry_seconds) for a in addresses]
        self.timeout = timeout
        self.worker_id: int | None = None
        self._token = token
        self._use_shared_memory = shared_memory and shared_memory_available()
        # Described lazily, at the first push; None again once the model may have changed.
        self._shard_models: list[_ShardModel] | None = None
        # Per shard: its channel, or None where it stays on gRPC; None until tried.
        self._channels: list[SharedMemoryChannel | None] | None = None
        self._versions = [0] * len(self.shards)
        # The layout version each shard last told this client of.
        self._layouts = [0] * len(self.shards)
        # Each shard's server id at this client's registration.
        self._registered_with = [""] * len(self.shards)
        self._pool = futures.ThreadPoolExecutor(len(self.shards)) if len(self.shards) > 1 else None
        # Gradients of the next push handed over ahead of it (`write_ahead`).
        self._ahead: dict[str, np.ndarray] = {}

    # Membership ---------------------------------------------------------------------------

    def register(self, group: int = -1, worker_id: int = 0, chief: bool = False) -> Registration:
        """Joins the cluster (on every shard, under one id) and returns the worker's place;
        a `chief` says so (see `Stats.chief_batch`)."""
        host = socket.gethostname()
        replies = []
        for shard in self.shards:
            request = pb.RegisterRequest(worker_id=worker_id, group=group, host=host, chief=chief)
            reply = shard.call(lambda: shard.stub.Register(request, timeout=30, metadata=shard.metadata))
            worker_id, group = reply.worker_id, reply.group
            replies.append(reply)
        self.worker_id = worker_id
        self._versions = [r.model_version for r in replies]
        self._layouts = [0] * len(self.shards)
        self._registered_with = [r.server_id for r in replies]
        self._forget_model()
        return Registration(
            worker_id=worker_id,
            group=group,
            num_groups=replies[0].num_groups,
            model_initialized=all(r.model_initialized for r in replies),
            hyperparameters=Hyperparameters.from_proto(replies[0].hyperparameters),
        )

    def deregister(self) -> None:
        """Leaves the cluster, so the worker's group no longer waits for it."""
        request = pb.DeregisterRequest(worker_id=self._worker_id())
        self._each(lambda i, s: s.call(lambda: s.stub.Deregister(request, timeout=30, metadata=s.metadata)))
        self.worker_id = None

    # Model --------------------------------------------------------------------------------

    def init_model(self, weights: Mapping[str, np.ndarray], hyperparameters: Hyperparameters) -> bool:
        """Uploads the initial weights; False if the model was already initialised (by
        another worker or from a checkpoint), in which case the caller should pull."""
        placement = balance_by_bytes({n: w.nbytes for n, w in weights.items()}, len(self.shards))

        def upload(index: int, shard: ShardConnection) -> pb.InitModelReply:
            mine = {n: w for n, w in weights.items() if placement[n] == index}

            def requests() -> Iterator[pb.InitModelRequest | bytes]:
                yield pb.InitModelRequest(hyperparameters=hyperparameters.to_proto())
                yield from tensors.encode_messages(pb.InitModelRequest, mine)

            return shard.call(lambda: shard.tensor_stub.InitModel(requests(), timeout=self.timeout, metadata=shard.metadata))

        replies = self._each(upload)
        self._forget_model()
        if all(r.initialized_by_caller for r in replies):
            self._versions = [r.model_version for r in replies]
            return True
        return False

    def pull(self, only_if_newer: bool = False, wait_for_model: float = 0.0) -> PullResult:
        """Fetches the weights.

        Args:
            only_if_newer: Fetch only from shards whose weights changed since this client's
                last pull.
            wait_for_model: Seconds to wait for another worker to initialise the model.
        """

        def fetch(index: int, shard: ShardConnection) -> tuple[int, dict[str, np.ndarray]]:
            request = pb.PullRequest(
                newer_than=self._versions[index] if only_if_newer else -1,
                wait_for_model_seconds=wait_for_model,
            )
            return shard.call(
                lambda: _read_weights(
                    shard.tensor_stub.Pull(request, timeout=self.timeout + wait_for_model, metadata=shard.metadata)
                )[1:]
            )

        return self._merge(self._each(fetch))

    def push(
        self,
        gradients: Mapping[str, np.ndarray],
        step: int,
        example_count: int,
        batch: int | None = None,
        loss: float | None = None,
        learning_rate: float | None = None,
    ) -> PushResult:
        """Pushes one gradient and waits until its group step is applied.

        Args:
            gradients: One array per variable, the mean gradient over `example_count`
                examples, computed at the weights this client last pulled.
            step: This worker's step counter; strictly increasing. Sending a step again
                (a retry) never applies it twice.
            example_count: Examples behind the gradient; its weight in the group's mean.
            batch: The batch the gradient was computed on, as the server handed it out
                (`PushResult.next_batch`), or None when the caller reads its own.
            loss: The training loss of those examples, or None when the caller does not
                know it.
            learning_rate: The rate of this gradient's update, where the workers evaluate
                it (`Hyperparameters.learning_rate_from_workers`); None otherwise.
        """

        def send(index: int, shard: ShardConnection) -> PushResult:
            requests = self._push_requests(
                index, gradients, step, example_count, batch, loss, learning_rate=learning_rate
            )
            return self._result(index, shard.call(lambda: shard.tensor_stub.Push(requests(), timeout=self.timeout, metadata=shard.metadata)))

        return self._each(send)[0]

    def push_pull(
        self,
        gradients: Mapping[str, np.ndarray],
        step: int,
        example_count: int,
        batch: int | None = None,
        loss: float | None = None,
        skip_update: bool = False,
        learning_rate: float | None = None,
        while_waiting: Callable[[], None] | None = None,
    ) -> tuple[PushResult, PullResult]:
        """`push`, then the weights its group step produced, in one round trip.

        With `skip_update` (the worker's loss scale overflowed), the group step updates
        none of the trainable variables, whose gradients the server does not read (zeros
        will do), and `PushResult.update_skipped` says so; see `GroupCoordinator.push`.

        `while_waiting` is called once, after the gradients went out and before the
        reply is read, so that a caller's own work overlaps the servers'.

        Through shared memory the weights are read-only views of the segment, which the
        next `push_pull` overwrites: copy what you keep.
        """

        channels = self._connect()
        gradients = {**self._ahead, **gradients}
        self._ahead = {}
        broken: list[str] = []
        waiting = [while_waiting] if while_waiting is not None else []

        def wait_with_caller() -> None:
            if waiting:
                waiting.pop()()

        def send(index: int, shard: ShardConnection) -> tuple[PushResult, int, dict[str, np.ndarray]]:
            # One shard's exchange runs the caller's work: the first's.
            meanwhile = wait_with_caller if index == 0 else _nothing
            channel = channels[index]
            if channel is not None:
                header = self._push_header(index, step, example_count, batch, loss, skip_update, learning_rate)
                mine = self._shard_part(index, gradients)
                try:
                    push, version, weights = channel.push_pull(mine, header, meanwhile)
                    return self._result(index, push), version, weights
                except OSError:
                    # The shard went away (a restart, say): gRPC retries until it is back.
                    broken.append(shard.address)
            requests = self._push_requests(
                index, gradients, step, example_count, batch, loss, skip_update, learning_rate
            )

            def attempt() -> tuple[PushResult, int, dict[str, np.ndarray]]:
                # A streaming call returns at once: the requests go out from gRPC's thread.
                replies = shard.tensor_stub.PushPull(requests(), timeout=self.timeout, metadata=shard.metadata)
                try:
                    meanwhile()
                finally:
                    # Read even where the caller's work failed: an unread call is cancelled.
                    header, version, weights = _read_weights(replies)
                return self._result(index, header.push), version, weights

            return shard.call(attempt)

        try:
            replies = self._each(send)
        finally:
            if broken:
                logger.info("shared-memory exchange with %s closed; the next push connects again", broken)
                self._forget_model()
        return replies[0][0], self._merge([(version, weights) for _, version, weights in replies])

    def write_ahead(self, gradients: Mapping[str, np.ndarray]) -> None:
        """Hands over some of the next `push_pull`'s gradients before the others exist.

        A training step calls it with the gradients backpropagation produces first (the
        later layers'): through shared memory they are copied into the segment at once,
        while the step computes the rest, and the `push_pull` that follows leaves them
        out of its arguments. Over gRPC they are kept until that push.
        """
        channels = self._connect()
        for index in range(len(self.shards)):
            mine = self._shard_part(index, gradients)
            channel = channels[index]
            self._ahead.update(channel.write(mine) if channel is not None else mine)

    @property
    def shared_memory_shards(self) -> list[str]:
        """Addresses of the shards that `push_pull` reaches through shared memory; empty
        before the first `push_pull`."""
        return [shard.address for shard, channel in zip(self.shards, self._channels or []) if channel is not None]

    def describe(self) -> Description:
        """The variables, hyperparameters and groups, with the variables of every shard."""
        described = self._each(lambda i, s: self._describe(s))
        return dataclasses.replace(
            described[0],
            model_version=min(d.model_version for d in described),
            model_initialized=all(d.model_initialized for d in described),
            # The shard that restarted, when one did.
            resumed_from_version=max(d.resumed_from_version for d in described),
            variables=tuple(v for d in described for v in d.variables),
        )

    def restarted_shards(self) -> list[str]:
        """Addresses of the shards whose server is not the one this client registered
        with: they restarted since (and know none of their workers until they register)."""
        described = self._each(lambda i, s: self._describe(s))
        return [
            shard.address
            for shard, description, registered in zip(self.shards, described, self._registered_with)
            if description.server_id != registered
        ]

    # Control ------------------------------------------------------------------------------

    def set_hyperparameters(self, hyperparameters: Hyperparameters, fresh_optimizer: bool = False) -> None:
        """Sets the update rule; with `fresh_optimizer`, its optimizer starts afresh, as a
        newly compiled Keras optimizer does (no state, iteration 0)."""
        request = pb.SetHyperparametersRequest(
            hyperparameters=hyperparameters.to_proto(), fresh_optimizer=fresh_optimizer
        )
        self._each(lambda i, s: s.call(lambda: s.stub.SetHyperparameters(request, timeout=30, metadata=s.metadata)))

    def set_groups(self, num_groups: int = 0, assignment: Mapping[int, int] | None = None) -> dict[int, int]:
        """Regroups the workers between group steps; returns worker id -> group.

        Args:
            num_groups: The new number of groups; 0 keeps the current one.
            assignment: Worker id -> group for the workers to place explicitly; the
                others are spread evenly.
        """
        request = pb.SetGroupsRequest(num_groups=num_groups, assignment=dict(assignment or {}))
        replies = self._each(lambda i, s: s.call(lambda: s.stub.SetGroups(request, timeout=self.timeout, metadata=s.metadata)))
        return dict(replies[0].assignment)

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Puts `weights` (every variable of the model) in place of the servers', keeping
        the optimizer's state: see `SetWeights`."""

        def upload(index: int, shard: ShardConnection) -> pb.SetWeightsReply:
            mine = self._shard_part(index, weights)
            return shard.call(
                lambda: shard.tensor_stub.SetWeights(
                    tensors.encode_messages(pb.SetWeightsRequest, mine), timeout=self.timeout, metadata=shard.metadata
                )
            )

        self._each(upload)

    def replace_model(
        self, weights: Mapping[str, np.ndarray], hyperparameters: Hyperparameters, fresh_optimizer: bool
    ) -> None:
        """Puts other variables (`weights`, every one the servers are to hold) in place of
        the model's, spread over the shards afresh: see `ReplaceModel`. With
        `fresh_optimizer` the optimizer starts afresh; otherwise the variables kept keep
        their state."""
        placement = balance_by_bytes({n: w.nbytes for n, w in weights.items()}, len(self.shards))
        header = pb.ReplaceModelHeader(hyperparameters=hyperparameters.to_proto(), fresh_optimizer=fresh_optimizer)

        def upload(index: int, shard: ShardConnection) -> pb.ReplaceModelReply:
            mine = {n: w for n, w in weights.items() if placement[n] == index}

            def requests() -> Iterator[pb.ReplaceModelRequest | bytes]:
                yield pb.ReplaceModelRequest(header=header)
                yield from tensors.encode_messages(pb.ReplaceModelRequest, mine)

            return shard.call(lambda: shard.tensor_stub.ReplaceModel(requests(), timeout=self.timeout, metadata=shard.metadata))

        self._forget_model()
        # The caller's weights are the model's now: its gradients may be pushed at once.
        self._versions = [reply.model_version for reply in self._each(upload)]

    def set_frozen_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Puts a model's frozen weights (see `SetFrozenWeights`) on the first server, in
        place of those it holds."""
        shard = self.shards[0]
        shard.call(
            lambda: shard.tensor_stub.SetFrozenWeights(
                tensors.encode_messages(pb.SetFrozenWeightsRequest, weights), timeout=self.timeout, metadata=shard.metadata
            )
        )

    def frozen_weights(self) -> dict[str, np.ndarray]:
        """The frozen weights the first server holds (none where none were set)."""
        shard = self.shards[0]

        def fetch() -> dict[str, np.ndarray]:
            assembler = tensors.TensorAssembler()
            for reply in shard.tensor_stub.GetFrozenWeights(
                pb.GetFrozenWeightsRequest(), timeout=self.timeout, metadata=shard.metadata
            ):
                assembler.add(reply.message.chunk, reply.data)
            return assembler.finish()

        return shard.call(fetch)

    def request_stop(self, history: str = "") -> None:
        """Ends training for every worker: each is told so in its next push result.
        `history` is the chief's History as JSON, which the others' `fit` returns."""
        request = pb.RequestStopRequest(history_json=history)
        self._each(lambda i, s: s.call(lambda: s.stub.RequestStop(request, timeout=30, metadata=s.metadata)))

    def save_snapshot(self, name: str) -> None:
        """Makes every shard keep an in-memory copy of its weights and momentum buffers."""
        request = pb.SnapshotRequest(name=name)
        self._each(lambda i, s: s.call(lambda: s.stub.SaveSnapshot(request, timeout=self.timeout, metadata=s.metadata)))

    def delete_snapshot(self, name: str) -> None:
        """Makes every shard forget a saved snapshot (a shard keeps 16 at most)."""
        request = pb.SnapshotRequest(name=name)
        self._each(lambda i, s: s.call(lambda: s.stub.DeleteSnapshot(request, timeout=30, metadata=s.metadata)))

    def restore_snapshot(self, name: str) -> int:
        """Puts a saved snapshot back on every shard, between group steps; returns the
        newest version it became (gradients computed before it are refused)."""
        request = pb.SnapshotRequest(name=name)
        replies = self._each(
            lambda i, s: s.call(lambda: s.stub.RestoreSnapshot(request, timeout=self.timeout, metadata=s.metadata))
        )
        return max(r.model_version for r in replies)

    def stats(self) -> list[Stats]:
        """Each shard's statistics: versions, staleness histograms per group, counters."""
        return self._each(
            lambda i, s: Stats.from_proto(s.call(lambda: s.stub.GetStats(pb.StatsRequest(), timeout=30, metadata=s.metadata)))
        )

    def checkpoint(self) -> list[str]:
        """Makes every shard write a checkpoint now; returns their paths."""
        replies = self._each(
            lambda i, s: s.call(lambda: s.stub.Checkpoint(pb.CheckpointRequest(), timeout=self.timeout, metadata=s.metadata))
        )
        return [r.path for r in replies]

    def close(self) -> None:
        self._forget_model()
        for shard in self.shards:
            shard.close()
        if self._pool is not None:
            self._pool.shutdown()

    def __enter__(self) -> "ParameterServerClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Internals ----------------------------------------------------------------------------

    def _push_requests(
        self,
        index: int,
        gradients: Mapping[str, np.ndarray],
        step: int,
        example_count: int,
        batch: int | None,
        loss: float | None = None,
        skip_update: bool = False,
        learning_rate: float | None = None,
    ) -> Callable[[], Iterator[pb.PushRequest | bytes]]:
        header = self._push_header(index, step, example_count, batch, loss, skip_update, learning_rate)
        mine = self._shard_part(index, gradients)

        def requests() -> Iterator[pb.PushRequest | bytes]:
            yield pb.PushRequest(header=header)
            yield from tensors.encode_messages(pb.PushRequest, mine)

        return requests

    def _push_header(
        self,
        index: int,
        step: int,
        example_count: int,
        batch: int | None,
        loss: float | None = None,
        skip_update: bool = False,
        learning_rate: float | None = None,
    ) -> pb.PushHeader:
        header = pb.PushHeader(
            worker_id=self._worker_id(),
            step=step,
            model_version=self._versions[index],
            example_count=example_count,
            known_layout_version=self._layouts[index],
            skip_update=skip_update,
        )
        # The first shard hands out the batches: the others see the groups' steps complete
        # in their own order.
        if batch is not None and index == 0:
            header.batch = batch
        if loss is not None:
            header.loss = loss
        if learning_rate is not None:
            header.learning_rate = learning_rate
        return header

    def _shard_part(self, index: int, gradients: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The gradients of the variables that live on shard `index`."""
        models = self._describe_shards()
        specs = models[index].specs
        # All of them this shard's (always, with one shard): one comparison of the names,
        # where the general case looks each one up twice (tens of µs of a step's exchange).
        if gradients.keys() <= specs.keys():
            return dict(gradients)
        unknown = gradients.keys() - set().union(*(m.specs.keys() for m in models))
        if unknown:
            raise KeyError(f"the server holds no variables named {sorted(unknown)}")
        return {n: g for n, g in gradients.items() if n in specs}

    def _describe_shards(self) -> list[_ShardModel]:
        if self._shard_models is None:
            models = []
            for shard in self.shards:
                described = self._describe(shard)
                specs = {spec.name: spec for spec in described.variables}
                models.append(_ShardModel(specs, described.shared_memory_socket, described.server_id))
            self._shard_models = models
        return self._shard_models

    def _describe(self, shard: ShardConnection) -> Description:
        return Description.from_proto(
            shard.call(lambda: shard.stub.Describe(pb.DescribeRequest(), timeout=30, metadata=shard.metadata))
        )

    def _result(self, index: int, reply: pb.PushReply) -> PushResult:
        result = PushResult.from_proto(reply)
        self._layouts[index] = result.layout_version
        return result

    def _connect(self) -> list[SharedMemoryChannel | None]:
        """The shared-memory channel to each shard, connected at the first push; None
        where a shard is on another host, offers none, or refused."""
        models = self._describe_shards()
        if self._channels is None:
            self._channels = [
                self._try_channel(shard, model) if self._use_shared_memory else None
                for shard, model in zip(self.shards, models)
            ]
        return self._channels

    def _try_channel(self, shard: ShardConnection, model: _ShardModel) -> SharedMemoryChannel | None:
        if not model.shared_memory_socket or not model.specs:
            return None
        try:
            return SharedMemoryChannel(
                model.shared_memory_socket, model.server_id, self._worker_id(), model.specs,
                self._token, self.timeout,
            )
        except (OSError, grpc.RpcError) as error:
            # Another host, most often: the socket's path does not exist here.
            logger.debug("no shared-memory exchange with %s: %s", shard.address, error)
            return None

    def _forget_model(self) -> None:
        """Drops what was described and connected: the next push describes again."""
        for channel in self._channels or []:
            if channel is not None:
                channel.close()
        self._channels = None
        self._shard_models = None

    def _merge(self, replies: list[tuple[int, dict[str, np.ndarray]]]) -> PullResult:
        for index, (version, shard_weights) in enumerate(replies):
            if shard_weights:
                self._versions[index] = version
        if len(replies) == 1:
            # As they came: a segment's weights stay views of its buffer (see
            # `strategy.worker.packed`).
            return PullResult(replies[0][0], replies[0][1].copy())
        weights: dict[str, np.ndarray] = {}
        for _, shard_weights in replies:
            weights.update(shard_weights)
        return PullResult(min(version for version, _ in replies), weights)

    def _each(self, call: Callable[[int, ShardConnection], _T]) -> list[_T]:
        """Runs `call(index, shard)` on every shard, in parallel when there are several."""
        if self._pool is None:
            return [call(0, self.shards[0])]
        return list(self._pool.map(call, range(len(self.shards)), self.shards))

    def _worker_id(self) -> int:
        if self.worker_id is None:
            raise RuntimeError("register() first")
        return self.worker_id


def _nothing() -> None:
    pass


def _read_weights(
    replies: Iterator[tensors.Received[pb.PullReply]],
) -> tuple[pb.PullHeader, int, dict[str, np.ndarray]]:
    header = next(replies).message.header
    assembler = tensors.TensorAssembler()
    for reply in replies:
        assembler.add(reply.message.chunk, reply.data)
    return header, header.model_version, assembler.finish()

