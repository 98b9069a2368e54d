"""What the parameter server answers, as plain values. Each converts from and to its
message here, so that the strategy and the tuner never handle generated protobuf types."""

import math
from dataclasses import dataclass

import numpy as np

from omnikeras.parameter_server.tensors import VariableSpec
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.v1 import parameter_server_pb2 as pb


@dataclass(frozen=True)
class Registration:
    worker_id: int
    group: int
    num_groups: int
    model_initialized: bool
    hyperparameters: Hyperparameters


@dataclass(frozen=True)
class PullResult:
    # The oldest version among the shards that answered.
    model_version: int
    # Only the variables of shards that had something newer when `only_if_newer` was set.
    weights: dict[str, np.ndarray]


@dataclass(frozen=True)
class GroupLayout:
    """The members of every group, as of one layout version."""

    version: int
    groups: tuple[tuple[int, ...], ...]

    def group_of(self, worker_id: int) -> int | None:
        return next((g for g, members in enumerate(self.groups) if worker_id in members), None)

    @classmethod
    def from_proto(cls, message: pb.GroupLayout) -> "GroupLayout":
        return cls(message.version, tuple(tuple(g.workers) for g in message.groups))

    def to_proto(self) -> pb.GroupLayout:
        return pb.GroupLayout(version=self.version, groups=[pb.GroupMembers(workers=g) for g in self.groups])


@dataclass(frozen=True)
class PushResult:
    model_version: int
    group: int
    members_combined: int
    # Training is over: the worker should stop and deregister.
    stop_requested: bool = False
    # Changes whenever groups or their members change.
    layout_version: int = 0
    # The batch the worker reads at its next step, and the workers that share it.
    next_batch: int = -1
    next_members: tuple[int, ...] = ()
    # The groups' members, when the layout changed since the one the pusher knew.
    layout: GroupLayout | None = None
    # The group step updated no weight: a member skipped it (its loss scale overflowed).
    update_skipped: bool = False
    # Updates applied after the group step: Keras' `optimizer.iterations`.
    iterations: int = 0

    @classmethod
    def from_proto(cls, reply: pb.PushReply) -> "PushResult":
        return cls(
            reply.model_version,
            reply.group,
            reply.group_members_combined,
            reply.stop_requested,
            reply.layout_version,
            reply.next_batch,
            tuple(reply.next_members),
            GroupLayout.from_proto(reply.layout) if reply.HasField("layout") else None,
            reply.update_skipped,
            reply.iterations,
        )

    def to_proto(self) -> pb.PushReply:
        return pb.PushReply(
            model_version=self.model_version,
            group=self.group,
            group_members_combined=self.members_combined,
            stop_requested=self.stop_requested,
            layout_version=self.layout_version,
            next_batch=self.next_batch,
            next_members=self.next_members,
            layout=self.layout.to_proto() if self.layout is not None else None,
            update_skipped=self.update_skipped,
            iterations=self.iterations,
        )


@dataclass(frozen=True)
class GroupStats:
    group: int
    members: tuple[int, ...]
    updates_applied: int
    # Staleness (versions behind at apply time) -> number of updates.
    staleness_histogram: dict[int, int]
    # The batch the group reads at its current step, and the workers that share it; -1
    # for a group without members.
    next_batch: int = -1
    next_members: tuple[int, ...] = ()

    @classmethod
    def from_proto(cls, message: pb.GroupStats) -> "GroupStats":
        return cls(
            message.group,
            tuple(message.members),
            message.updates_applied,
            dict(message.staleness_histogram),
            message.next_batch,
            tuple(message.next_members),
        )

    def to_proto(self) -> pb.GroupStats:
        return pb.GroupStats(
            group=self.group,
            members=self.members,
            updates_applied=self.updates_applied,
            staleness_histogram=self.staleness_histogram,
            next_batch=self.next_batch,
            next_members=self.next_members,
        )


@dataclass(frozen=True)
class Stats:
    """One server's counters, its update rule and its groups."""

    model_version: int
    updates_applied: int
    pushes_received: int
    pushes_rejected_non_finite: int
    workers_dropped: int
    parameter_count: int
    parameter_bytes: int
    hyperparameters: Hyperparameters
    groups: tuple[GroupStats, ...]
    mean_apply_seconds: float
    uptime_seconds: float = 0.0
    # Measured from the updates themselves: `omnikeras.parameter_server.momentum_meter`.
    total_momentum: float = math.nan
    # The rule the next update applies, and the staleness's momentum:
    # `omnikeras.parameter_server.compensation`.
    momentum_in_force: float = math.nan
    learning_rate_in_force: float = math.nan
    implicit_momentum: float = math.nan
    step_backoffs: int = 0
    step_share: float = math.nan
    # Trainings that ended (the last worker left), and the History the chief of the last
    # one handed over, as JSON: `GroupCoordinator.request_stop`.
    trainings_ended: int = 0
    chief_history: str = ""
    # The latest batch the chief pushed a gradient of (-1 for none), and whether it ended
    # its training: `GroupCoordinator.push` and `request_stop`.
    chief_batch: int = -1
    stop_requested: bool = False

    @property
    def workers(self) -> int:
        """How many workers are registered, over all groups."""
        return sum(len(group.members) for group in self.groups)

    @classmethod
    def from_proto(cls, reply: pb.StatsReply) -> "Stats":
        return cls(
            reply.model_version,
            reply.updates_applied,
            reply.pushes_received,
            reply.pushes_rejected_non_finite,
            reply.workers_dropped,
            reply.parameter_count,
            reply.parameter_bytes,
            Hyperparameters.from_proto(reply.hyperparameters),
            tuple(GroupStats.from_proto(g) for g in reply.groups),
            reply.mean_apply_seconds,
            reply.uptime_seconds,
            reply.total_momentum,
            reply.momentum_in_force,
            reply.learning_rate_in_force,
            reply.implicit_momentum,
            reply.step_backoffs,
            reply.step_share,
            reply.trainings_ended,
            reply.chief_history_json,
            reply.chief_batch,
            reply.stop_requested,
        )

    def to_proto(self) -> pb.StatsReply:
        return pb.StatsReply(
            model_version=self.model_version,
            updates_applied=self.updates_applied,
            pushes_received=self.pushes_received,
            pushes_rejected_non_finite=self.pushes_rejected_non_finite,
            workers_dropped=self.workers_dropped,
            parameter_count=self.parameter_count,
            parameter_bytes=self.parameter_bytes,
            hyperparameters=self.hyperparameters.to_proto(),
            groups=[g.to_proto() for g in self.groups],
            mean_apply_seconds=self.mean_apply_seconds,
            uptime_seconds=self.uptime_seconds,
            total_momentum=self.total_momentum,
            momentum_in_force=self.momentum_in_force,
            learning_rate_in_force=self.learning_rate_in_force,
            implicit_momentum=self.implicit_momentum,
            step_backoffs=self.step_backoffs,
            step_share=self.step_share,
            trainings_ended=self.trainings_ended,
            chief_history_json=self.chief_history,
            chief_batch=self.chief_batch,
            stop_requested=self.stop_requested,
        )


@dataclass(frozen=True)
class Description:
    """What a server holds: its model's variables and state, and how to reach it."""

    model_initialized: bool
    model_version: int
    variables: tuple[VariableSpec, ...]
    hyperparameters: Hyperparameters
    num_groups: int
    # The server's Unix socket for the shared-memory exchange; empty when it offers none.
    shared_memory_socket: str
    # A random id of the server process.
    server_id: str
    # The checkpoint's version it resumed from when it started; -1 without one.
    resumed_from_version: int
    # Updates applied: Keras' `optimizer.iterations`.
    iterations: int = 0

    @classmethod
    def from_proto(cls, reply: pb.DescribeReply) -> "Description":
        return cls(
            reply.model_initialized,
            reply.model_version,
            tuple(VariableSpec.from_proto(v) for v in reply.variables),
            Hyperparameters.from_proto(reply.hyperparameters),
            reply.num_groups,
            reply.shared_memory_socket,
            reply.server_id,
            reply.resumed_from_version,
            reply.iterations,
        )

    def to_proto(self) -> pb.DescribeReply:
        return pb.DescribeReply(
            model_initialized=self.model_initialized,
            model_version=self.model_version,
            variables=[v.to_proto() for v in self.variables],
            hyperparameters=self.hyperparameters.to_proto(),
            num_groups=self.num_groups,
            shared_memory_socket=self.shared_memory_socket,
            server_id=self.server_id,
            resumed_from_version=self.resumed_from_version,
            iterations=self.iterations,
        )
