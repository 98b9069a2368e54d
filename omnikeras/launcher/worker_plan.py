"""Which worker processes the launcher starts, with which batch shares and threads.

On a CPU host, co-located workers of one group would compete for the same cores, each
running small, poorly batched operations. The batch-merging CPU path starts ONE process
per group instead, which trains the group's whole batch as one merged batch per step.
The group math is unchanged: the server's update is the mean of the members' gradients
weighted by their example counts, which is the gradient of the merged batch; the merged
process is the group's only member, with the sum of the example counts.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from omnikeras.emulation.spec import ClusterSpec
from omnikeras.profiles.profile import ClusterProfile, DeviceProfile
from omnikeras.profiles.threads import ThreadSettings


@dataclass(frozen=True)
class WorkerPlan:
    """The worker processes of a local cluster.

    Args:
        num_workers: How many worker processes to start.
        merged: Whether each process stands for all the workers of its group.
        throughputs: Examples/s of each process, which size the batch shares; None gives
            equal shares.
        environments: Variables to set in each process: thread settings, and the visible
            GPU where a profile placed the worker on one.
        message: What the launcher tells the user about the plan, or None.
    """

    num_workers: int
    merged: bool
    throughputs: tuple[float, ...] | None
    environments: tuple[dict[str, str], ...]
    message: str | None = None


def plan_workers(
    workers: int,
    groups: int,
    gpus: int,
    cores: int,
    throughputs: Sequence[float] | None = None,
    profile: ClusterProfile | None = None,
    merge: bool = True,
    threads: ThreadSettings | None = None,
) -> WorkerPlan:
    """Decides the worker processes for `workers` workers in `groups` groups.

    On a host with no visible GPU and `merge` on, the cluster runs one process per group
    (the batch-merging CPU path), sharing the cores among the `groups` processes with the
    measured thread settings: the profile's CPU settings, else `threads`. Otherwise one
    process per worker: with a profile, workers take its devices in turn (on a GPU host
    each sees its own device only) and their throughputs come from the profile, unless
    `throughputs` are given.

    Args:
        workers, groups: The requested cluster.
        gpus: GPUs visible on this host.
        cores: Cores of this host.
        throughputs: Explicit examples/s of each worker, or None.
        profile: A measured profile of this host, or None.
        merge: Whether to merge co-located workers on a CPU host. Defaults to True.
        threads: Measured CPU thread settings for one process alone on the cores, used
            when the profile has none; None falls back to dividing the cores evenly.
            Every worker gets two inter-op threads at least (`ThreadSettings.for_worker`).

    Example:

    >>> plan = plan_workers(4, 2, gpus=0, cores=8, threads=ThreadSettings(8, 1))
    >>> plan.num_workers, plan.environments[0]["TF_NUM_INTRAOP_THREADS"]
    (2, '4')
    """
    if profile is not None and profile.cpu is not None and profile.cpu.intra_op_threads:
        threads = ThreadSettings(profile.cpu.intra_op_threads, profile.cpu.inter_op_threads or 1)
    if merge and gpus == 0:
        shared = (threads or ThreadSettings(cores, 1)).shared_by(groups).for_worker()
        if workers > groups:
            message = (
                f"CPU host: the {workers} workers of {groups} group{'s' * (groups > 1)} run as {groups} "
                f"process{'es' * (groups > 1)}, one per group, each training its group's whole batch as one "
                f"merged batch per step"
            )
        else:
            message = "CPU host: one process per group"
        message += (
            f", with {shared.intra_op} intra-op and {shared.inter_op} inter-op threads each "
            "(--no-merge starts one process per worker)"
        )
        return WorkerPlan(groups, True, None, (shared.environment(),) * groups, message)

    devices = _assign_devices(workers, profile, gpus)
    if throughputs is None and devices is not None:
        throughputs = [_share_of(device, devices) for device in devices]
    per_process = (threads.shared_by(workers) if threads else ThreadSettings(max(1, cores // workers), 1)).for_worker()
    environments = []
    for index in range(workers):
        environment = per_process.environment()
        if devices is not None and gpus > 0:
            kind, _, number = devices[index].name.strip("/").partition(":")
            environment["CUDA_VISIBLE_DEVICES"] = number if kind == "GPU" else "-1"
        environments.append(environment)
    placed: str | None = None
    if devices is not None:
        placed = "workers on " + ", ".join(f"{i}: {d.name}" for i, d in enumerate(devices))
    return WorkerPlan(
        workers, False, tuple(throughputs) if throughputs else None, tuple(environments), placed
    )


def _assign_devices(workers: int, profile: ClusterProfile | None, gpus: int) -> list[DeviceProfile] | None:
    if profile is None:
        return None
    usable = [d for d in profile.devices if d.kind == "CPU" or int(d.name.rpartition(":")[2]) < gpus]
    if not usable:
        raise ValueError(f"none of the profile's devices ({[d.name for d in profile.devices]}) is on this host")
    # GPUs first: with fewer workers than devices, the fast ones are used.
    usable.sort(key=lambda d: d.kind != "GPU")
    return [usable[index % len(usable)] for index in range(workers)]


def _share_of(device: DeviceProfile, devices: list[DeviceProfile]) -> float:
    # Workers placed on the same device split its throughput.
    return device.peak_throughput / sum(d.name == device.name for d in devices)


def plan_emulated_workers(spec: ClusterSpec, workers: int | None, groups: int) -> WorkerPlan:
    """One process per emulated host: each host is one device, so its workers train as
    one merged process, with threads for the cores the host may use and a share of its
    group's batch in proportion to them.

    Example:

    >>> plan = plan_emulated_workers(ClusterSpec.load("mixed"), None, groups=1)
    >>> plan.num_workers, plan.throughputs
    (5, (1.0, 0.25, 0.25, 0.25, 0.25))
    """
    if workers is not None and workers != spec.workers:
        raise ValueError(f"spec {spec.name} has {spec.workers} workers; --workers says {workers}")
    hosts = len(spec.hosts)
    if groups > hosts:
        raise ValueError(f"{groups} groups need at least as many emulated hosts; spec {spec.name} has {hosts}")
    environments = tuple(ThreadSettings(max(1, int(host.cores)), 1).for_worker().environment() for host in spec.hosts)
    caps = sorted({f"{host.cores:g}" for host in spec.hosts})
    message = (
        f"emulating {spec.name}: {hosts} hosts ({', '.join(caps)} cores), each one worker process, "
        f"parameter servers behind {spec.link_bits_per_second / 1e6:g} Mbit/s per direction"
    )
    return WorkerPlan(hosts, True, tuple(host.cores for host in spec.hosts), environments, message)
