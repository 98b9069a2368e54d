"""Where a worker stands among the groups, and how much of each batch it takes."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from omnikeras.parameter_server import GroupLayout


@dataclass(frozen=True)
class GroupPlace:
    """A worker's place: its group, one of `num_groups`, reads the batches the server hands
    it, and member `i` takes the rows between `boundaries[i]` and `boundaries[i + 1]`
    (fractions of the batch), in proportion to its throughput, so members finish together.
    """

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

    def rows_per_member(self, batch_size: int) -> np.ndarray:
        """How many rows of a batch of `batch_size` each member takes."""
        return np.diff(np.round(batch_size * np.array(self.boundaries)).astype(int))

    def part_of_batches(self, throughput_of: Callable[[int], float], workers: Sequence[int]) -> float:
        """The part of the batches this group reads, of those read by `workers`: the server
        hands each batch to the group that asks first, so a group's part is its members'
        throughput over all workers'."""
        return sum(throughput_of(m) for m in self.members) / sum(throughput_of(w) for w in workers)

    def min_batch_size(self) -> int:
        """The smallest batch of which every member gets at least one row."""
        size = len(self.members)
        while self.rows_per_member(size).min() < 1:
            size += 1
        return size

    @classmethod
    def of(cls, worker_id: int, layout: GroupLayout, throughput_of: Callable[[int], float]) -> "GroupPlace":
        """The place of `worker_id` in the server's groups."""
        group = layout.group_of(worker_id)
        if group is None:
            raise RuntimeError(f"worker {worker_id} is in no group: it was dropped or never joined")
        return cls.among(worker_id, layout.groups[group], throughput_of, group, len(layout.groups))

    @classmethod
    def among(
        cls,
        worker_id: int,
        members: Sequence[int],
        throughput_of: Callable[[int], float],
        group: int,
        num_groups: int,
    ) -> "GroupPlace":
        """The place of `worker_id` among the `members` that share a batch."""
        members = tuple(sorted(members))
        throughputs = np.array([throughput_of(m) for m in members])
        boundaries = np.concatenate([[0.0], np.cumsum(throughputs) / throughputs.sum()])
        boundaries[-1] = 1.0
        return cls(
            group=group,
            num_groups=num_groups,
            members=members,
            boundaries=tuple(float(b) for b in boundaries),
            member_index=members.index(worker_id),
        )
