"""Where the parameter servers and workers of a run go on a Ray cluster.

Each GPU is one worker (`num_gpus=1`); each CPU-only node is one merged worker with the
CPUs the servers leave it (the batch-merging CPU path, per node), or with `merge` off one
worker per CPU. More workers than that share the CPU nodes, as the local launcher's
processes share one machine's cores: a node's workers split its free CPUs evenly, in
fractions of a logical CPU where need be. Servers take `SERVER_CPUS` each (half a node
smaller than twice that), spread over the nodes: CPU-only nodes first, the ones with the
most CPUs first.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from omnikeras.profiles.profile import ClusterProfile
from omnikeras.profiles.threads import ThreadSettings

# Logical CPUs each parameter server holds on its node: it runs the updates.
SERVER_CPUS = 1.0
# The least a worker is given where workers share a node: below a tenth of a CPU its
# process would mostly wait for its turn, and such a plan is refused as having no room.
MIN_WORKER_CPUS = 0.1
# Ray counts logical CPUs in steps of 1/10000.
_CPU_STEPS = 10_000


@dataclass(frozen=True)
class RayNode:
    """A live node of the Ray cluster and its logical resources; nodes of one `kind`
    (by default their CPUs and GPUs) train alike."""

    node_id: str
    cpus: float
    gpus: int
    kind: str = ""

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", node_kind(self.cpus, self.gpus))


def node_kind(cpus: float, gpus: int, accelerators: Sequence[str] = ()) -> str:
    """What tells nodes apart for training: CPUs, GPUs and the GPUs' type.

    >>> node_kind(8, 2, ["A100"])
    '8 CPUs, 2 GPUs (A100)'
    """
    kind = f"{cpus:g} CPU{'s' * (cpus != 1)}, {gpus} GPU{'s' * (gpus != 1)}"
    return kind + (f" ({', '.join(accelerators)})" if accelerators else "")


@dataclass(frozen=True)
class Slot:
    """What one actor holds: its node and logical resources."""

    node_id: str
    num_cpus: float
    num_gpus: int = 0

    def describe(self) -> str:
        cpus = f"{self.num_cpus:g} CPU{'s' * (self.num_cpus != 1)}"
        return f"1 GPU and {cpus}" if self.num_gpus else cpus


@dataclass(frozen=True)
class RayPlan:
    """The actors of a run on a Ray cluster.

    Args:
        servers: Where each parameter-server shard runs.
        workers: Where each worker process runs, the chief first.
        throughputs: Examples/s of each worker, which size its share of its group's batch;
            None gives equal shares.
        environments: Thread settings of each worker process.
        message: What the launcher tells the user about the plan.
    """

    servers: tuple[Slot, ...]
    workers: tuple[Slot, ...]
    throughputs: tuple[float, ...] | None
    environments: tuple[dict[str, str], ...]
    message: str


def plan_ray_cluster(
    nodes: Sequence[RayNode],
    workers: int | None,
    groups: int,
    ps_shards: int,
    merge: bool = True,
    throughputs: Sequence[float] | None = None,
    profile_of: Callable[[RayNode], ClusterProfile] | None = None,
) -> RayPlan:
    """Places `ps_shards` servers and the workers of `groups` groups on `nodes`.

    `workers` defaults to every place the cluster has (one per GPU, one per CPU node with
    a whole CPU left), and to at least one per group; a smaller number takes the GPUs
    first, then the CPU nodes with the most CPUs. A larger number shares the CPU nodes:
    each next worker goes to the node where the workers keep the most CPUs each, and a
    node's workers split its free CPUs evenly, down to `MIN_WORKER_CPUS` each. With
    `merge` on, a CPU node takes at most one worker per group (more would be members of
    one group on one node, which the merged path trains as one): workers asked for
    beyond that run merged, as fewer workers, as locally one process per group does.
    A plan is refused when the workers cannot have `MIN_WORKER_CPUS` each (with `merge`,
    one per group), or a server no CPUs.

    Without `throughputs`, workers on alike places get equal shares and CPU workers shares
    in proportion to their CPUs; where GPU and CPU workers mix, each gets the peak
    throughput of its device in `profile_of` its node (asked once per kind of node), and
    without `profile_of` such a plan is refused.

    Example:

    >>> nodes = [RayNode("head", cpus=8, gpus=0), RayNode("gpu", cpus=8, gpus=2)]
    >>> plan = plan_ray_cluster(nodes, workers=2, groups=2, ps_shards=1)
    >>> [(slot.node_id, slot.num_gpus) for slot in plan.workers]
    [('gpu', 1), ('gpu', 1)]

    Two groups on one machine of 2 CPUs: the server holds one, the workers share the other.

    >>> plan = plan_ray_cluster([RayNode("laptop", cpus=2, gpus=0)], workers=2, groups=2, ps_shards=1)
    >>> [slot.num_cpus for slot in plan.workers]
    [0.5, 0.5]
    """
    if ps_shards < 1 or groups < 1 or (workers is not None and workers < 1):
        raise ValueError("workers, groups and ps_shards must be at least 1")
    if workers is not None and groups > workers:
        raise ValueError(f"{groups} groups need at least as many workers, got {workers}")
    nodes = [node for node in nodes if node.cpus > 0 or node.gpus > 0]
    if not nodes:
        raise ValueError("the Ray cluster has no node with CPUs or GPUs")
    free = {node.node_id: float(node.cpus) for node in nodes}
    servers = []
    hosts = sorted(nodes, key=lambda node: (node.gpus > 0, -node.cpus))
    for shard in range(ps_shards):
        node = hosts[shard % len(hosts)]
        cpus = min(SERVER_CPUS, node.cpus / 2) or SERVER_CPUS
        if free[node.node_id] < cpus:
            raise ValueError(
                f"{ps_shards} parameter servers need {cpus:g} CPU each; node {node.node_id} has "
                f"{free[node.node_id]:g} left"
            )
        free[node.node_id] -= cpus
        servers.append(Slot(node.node_id, cpus))

    # Workers per CPU node: one with a whole CPU left (one per whole CPU without merge).
    cpu_nodes = sorted((n for n in nodes if not n.gpus and free[n.node_id] > 0), key=lambda n: -free[n.node_id])
    count = {n.node_id: (1 if merge else math.floor(free[n.node_id])) if free[n.node_id] >= 1 else 0 for n in cpu_nodes}
    gpu_workers = sum(node.gpus for node in nodes)
    asked = max(gpu_workers + sum(count.values()), groups) if workers is None else workers
    most_per_node = groups if merge else asked
    while gpu_workers + sum(count.values()) < asked:
        roomy = [
            n for n in cpu_nodes
            if count[n.node_id] < most_per_node and _cpus_each(free[n.node_id], count[n.node_id] + 1) >= MIN_WORKER_CPUS
        ]
        if not roomy:
            break
        count[max(roomy, key=lambda n: free[n.node_id] / (count[n.node_id] + 1)).node_id] += 1

    places = []
    for node in nodes:
        cpus = free[node.node_id]
        if node.gpus:
            places += [Slot(node.node_id, cpus / node.gpus, 1)] * node.gpus
        elif count.get(node.node_id):
            places += [Slot(node.node_id, _cpus_each(cpus, count[node.node_id]))] * count[node.node_id]
    places.sort(key=lambda slot: (-slot.num_gpus, -slot.num_cpus))
    # With merge, workers beyond one per group on each CPU node run merged, as fewer.
    merged = merge and any(count[node.node_id] == groups for node in cpu_nodes)
    if len(places) < (groups if merged else asked):
        raise ValueError(
            f"the Ray cluster has room for {len(places)} worker{'s' * (len(places) != 1)}"
            f"{f' ({_count(places)})' if places else ''}; "
            + (f"{groups} needed, one per group" if workers is None or merged else f"{asked} asked for")
            + (
                f" (workers that share a CPU node hold {MIN_WORKER_CPUS:g} CPU each at least, beside "
                f"{ps_shards} parameter server{'s' * (ps_shards != 1)})"
                if cpu_nodes or not places else ""
            )
        )
    chosen = tuple(places[:asked])
    workers = len(chosen)

    if throughputs is not None:
        if len(throughputs) != workers:
            raise ValueError(f"{len(throughputs)} throughputs for {workers} workers")
        shares: tuple[float, ...] | None = tuple(throughputs)
    elif len({(slot.num_gpus, slot.num_cpus) for slot in chosen}) == 1:
        shares = None
    elif any(slot.num_gpus for slot in chosen):
        if profile_of is None:
            raise ValueError(
                "the workers mix GPUs and CPUs: give each one's examples/s with throughputs (--throughputs), "
                "as `omnikeras profile` measures them on each kind of node"
            )
        shares = _profiled_shares(chosen, {node.node_id: node for node in nodes}, profile_of)
    else:
        shares = tuple(slot.num_cpus for slot in chosen)
    environments = tuple(
        ThreadSettings(max(1, math.floor(slot.num_cpus)), 1).for_worker().environment() for slot in chosen
    )
    message = (
        f"Ray cluster of {len(nodes)} node{'s' * (len(nodes) != 1)}: {ps_shards} parameter "
        f"server{'s' * (ps_shards != 1)}, {workers} worker{'s' * (workers != 1)} ({_count(chosen)}) "
        f"in {groups} group{'s' * (groups != 1)}"
    )
    if workers < asked:
        message += (
            f"; the {asked} workers asked for run merged as {workers}, at most one per group on a CPU node, "
            "each training its group's share as one batch (--no-merge: one per worker)"
        )
    if shares is not None and throughputs is None:
        mixed = any(slot.num_gpus for slot in chosen)
        message += ", batch shares by their devices' profiles" if mixed else ", batch shares in proportion to their CPUs"
    return RayPlan(tuple(servers), chosen, shares, environments, message)


def _cpus_each(cpus: float, workers: int) -> float:
    """`cpus` split among `workers`, rounded down to what Ray counts."""
    return math.floor(cpus / workers * _CPU_STEPS + 1e-6) / _CPU_STEPS


def _profiled_shares(
    slots: Sequence[Slot], nodes: dict[str, RayNode], profile_of: Callable[[RayNode], ClusterProfile]
) -> tuple[float, ...]:
    profiles: dict[str, ClusterProfile] = {}
    shares = []
    for slot in slots:
        node = nodes[slot.node_id]
        if node.kind not in profiles:
            profiles[node.kind] = profile_of(node)
        devices = [d for d in profiles[node.kind].devices if d.kind == ("GPU" if slot.num_gpus else "CPU")]
        if not devices:
            raise ValueError(f"the profile of nodes of {node.kind} has no {'GPU' if slot.num_gpus else 'CPU'}")
        shares.append(devices[0].peak_throughput)
    return tuple(shares)


def _count(slots: Sequence[Slot]) -> str:
    kinds: dict[str, int] = {}
    for slot in slots:
        kinds[slot.describe()] = kinds.get(slot.describe(), 0) + 1
    return ", ".join(f"{count} with {kind}" for kind, count in kinds.items())
