"""`launch`: a local cluster of parameter-server shards and worker processes."""

import datetime
import os
import pathlib
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

from omnikeras.config import ENV_VAR, WorkerConfig
from omnikeras.launcher.processes import Child, ServerStartError, start_parameter_server
from omnikeras.launcher.worker_plan import WorkerPlan, plan_workers
from omnikeras.profiles.hardware import cpu_count, visible_gpu_count
from omnikeras.profiles.profile import ClusterProfile
from omnikeras.profiles.thread_cache import cached_thread_settings

_POLL_SECONDS = 0.2


class LaunchError(RuntimeError):
    """The cluster could not start, or a process it cannot do without failed."""


def launch(
    script: str,
    script_args: Sequence[str] = (),
    workers: int = 4,
    groups: int = 1,
    ps_shards: int = 1,
    throughputs: Sequence[float] | None = None,
    group_timeout: float = 60.0,
    token: str | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    profile: ClusterProfile | str | os.PathLike[str] | None = None,
    merge: bool = True,
    shared_memory: bool = True,
) -> int:
    """Runs `script` on a local cluster and returns its exit status.

    Starts `ps_shards` parameter servers and `workers` processes of `script`, each told its
    place through `OMNIKERAS_CONFIG`. On a host with no visible GPU it starts one process
    per group instead (the batch-merging CPU path, see `plan_workers`), and says so on
    stderr; `merge=False` turns this off. Each process gets measured CPU thread settings:
    the profile's, else ones measured once per machine and cached (unless
    `TF_NUM_INTRAOP_THREADS` and `TF_NUM_INTEROP_THREADS` are set, which win). The chief's (worker 0's) output streams to this
    process; the others' and the servers' go to log files. If a server or the chief fails,
    everything stops with a message naming the process and its log. If another worker
    fails, its group carries on without it and the failure is reported at the end. No
    process is left behind, also on Ctrl-C.

    Args:
        script: Path of the training script.
        script_args: Arguments passed to every worker's script.
        workers: Number of worker processes. Defaults to 4.
        groups: Number of compute groups. Defaults to 1 (synchronous).
        ps_shards: Number of parameter-server processes. Defaults to 1.
        throughputs: Examples/s of each worker, which sizes its share of its group's
            batch; None (the default) takes them from `profile`, or gives equal shares.
        group_timeout: Seconds a group waits for a missing member. Defaults to 60.
        token: Shared secret between servers and workers; None (the default) uses none.
        log_dir: Directory for the logs; defaults to `runs/launch-<time>`.
        seed: Seed of the data shuffle shared by the workers. Defaults to 0.
        profile: A `ClusterProfile` of this host, or the path of its JSON (written by
            `omnikeras profile`): sizes the batch shares and sets the thread settings.
        merge: Merge the co-located workers of each group into one process on a CPU
            host. Defaults to True; it has no effect where a GPU is visible.
        shared_memory: Workers exchange gradients and weights with the servers through
            shared memory. Defaults to True; False sends them over gRPC.

    Returns:
        0 if every worker finished, the chief's status if it failed, 1 if another
        process failed.

    Example:

    >>> launch("examples/fashion_mnist.py", ["--epochs", "1"], workers=4, groups=2)
    0
    """
    if workers < 1 or groups < 1 or ps_shards < 1:
        raise ValueError("workers, groups and ps_shards must be at least 1")
    if groups > workers:
        raise ValueError(f"{groups} groups need at least as many workers, got {workers}")
    if not pathlib.Path(script).is_file():
        raise FileNotFoundError(f"no training script at {script}")
    if throughputs is not None and len(throughputs) != workers:
        raise ValueError(f"{len(throughputs)} throughputs for {workers} workers")
    if profile is not None and not isinstance(profile, ClusterProfile):
        profile = ClusterProfile.load(profile)
    plan = _plan(workers, groups, throughputs, profile, merge)
    if plan.message:
        _say(plan.message)
    log_dir = pathlib.Path(log_dir or f"runs/launch-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = _Cluster(log_dir, token)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        addresses = cluster.start_servers(ps_shards, groups, group_timeout)
        for index in range(plan.num_workers):
            config = WorkerConfig(
                parameter_servers=tuple(addresses),
                worker_index=index,
                num_workers=plan.num_workers,
                throughputs=plan.throughputs,
                token=token,
                seed=seed,
                shared_memory=shared_memory,
            )
            cluster.start_worker(config, script, script_args, plan.environments[index])
        return cluster.watch()
    except KeyboardInterrupt:
        _say("interrupted: stopping the cluster")
        return 130
    finally:
        cluster.stop_all()
        signal.signal(signal.SIGTERM, previous)


def _plan(
    workers: int,
    groups: int,
    throughputs: Sequence[float] | None,
    profile: ClusterProfile | None,
    merge: bool,
) -> WorkerPlan:
    gpus = visible_gpu_count()
    threads = None
    exported = "TF_NUM_INTRAOP_THREADS" in os.environ and "TF_NUM_INTEROP_THREADS" in os.environ
    # Settings the user exported go to every process as they are: nothing to measure.
    if merge and gpus == 0 and not exported and (profile is None or profile.cpu is None):
        threads = cached_thread_settings(_say)
    return plan_workers(workers, groups, gpus, cpu_count(), throughputs, profile, merge, threads)


class _Cluster:
    def __init__(self, log_dir: pathlib.Path, token: str | None) -> None:
        self.log_dir = log_dir
        self.token = token
        self.servers: list[Child] = []
        self.workers: list[Child] = []

    def start_servers(self, shards: int, groups: int, group_timeout: float) -> list[str]:
        env = dict(os.environ)
        if self.token:
            env["OMNIKERAS_TOKEN"] = self.token
        addresses = []
        for shard in range(shards):
            args = [
                "--groups", str(groups), "--group-timeout", str(group_timeout),
                "--checkpoint-dir", str(self.log_dir / f"ps-{shard}-checkpoints"),
            ]
            log = open(self.log_dir / f"ps-{shard}.log", "w")
            try:
                server, address = start_parameter_server(args, log, env, name=f"parameter server {shard}")
            except ServerStartError as error:
                raise LaunchError(str(error)) from None
            self.servers.append(server)
            addresses.append(address)
        _say(f"parameter servers at {', '.join(addresses)}; logs in {self.log_dir}")
        return addresses

    def start_worker(
        self, config: WorkerConfig, script: str, script_args: Sequence[str], settings: dict[str, str]
    ) -> None:
        env = dict(os.environ)
        env[ENV_VAR] = config.to_json()
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # A worker that crashes in native code leaves its threads' Python stacks in its log.
        env.setdefault("PYTHONFAULTHANDLER", "1")
        for name, value in settings.items():
            # Thread settings the user exported win over the plan's.
            if name.startswith("TF_NUM_"):
                env.setdefault(name, value)
            else:
                env[name] = value
        log = None if config.is_chief else open(self.log_dir / f"worker-{config.worker_index}.log", "w")
        name = "the chief (worker 0)" if config.is_chief else f"worker {config.worker_index}"
        self.workers.append(Child(name, [sys.executable, script, *script_args], env, log))

    def watch(self) -> int:
        """Waits for the workers; returns the cluster's exit status."""
        chief, others = self.workers[0], self.workers[1:]
        reported: set[int] = set()
        while True:
            for server in self.servers:
                if server.returncode is not None:
                    raise LaunchError(f"{server.describe_exit()}: stopping the cluster")
            for index, worker in enumerate(others, start=1):
                if worker.returncode not in (None, 0) and index not in reported:
                    _say(f"{worker.describe_exit()}; its group carries on without it")
                    reported.add(index)
            if chief.returncode is not None:
                break
            time.sleep(_POLL_SECONDS)
        if chief.returncode != 0:
            _say(f"{chief.describe_exit()}: stopping the cluster")
            return chief.returncode or 1
        # The chief ended training for everyone; the others follow within a step.
        deadline = time.monotonic() + 120
        while any(w.returncode is None for w in others) and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
        failed = [w.describe_exit() for w in others if w.returncode not in (None, 0)]
        if failed:
            _say("training finished, but " + "; ".join(failed))
            return 1
        return 0

    def stop_all(self) -> None:
        for child in [*self.workers, *self.servers]:
            child.terminate()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _say(message: str) -> None:
    print(f"omnikeras launch: {message}", file=sys.stderr, flush=True)
