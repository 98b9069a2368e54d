"""`launch`: a local cluster of parameter-server shards and worker processes."""

import contextlib
import dataclasses
import datetime
import functools
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

from omnikeras.config import WorkerConfig
from omnikeras.emulation import ClusterSpec, EmulatedCluster, FaultInjector, FaultSpec, HostSpec
from omnikeras.launcher import ray_address
from omnikeras.launcher.worker_plan import WorkerPlan, plan_emulated_workers, plan_workers
from omnikeras.processes import Child, ServerStartError, start_parameter_server
from omnikeras.processes.worker import python_command, start_worker
from omnikeras.profiles.hardware import cpu_count, visible_gpu_count
from omnikeras.profiles.profile import ClusterProfile
from omnikeras.profiles.thread_cache import cached_thread_settings

_POLL_SECONDS = 0.2
# Times the launcher restarts one process that died before giving up on it.
MAX_RESTARTS = 3


class LaunchError(RuntimeError):
    """The cluster could not start, or a process it cannot do without failed."""


def launch(
    script: str,
    script_args: Sequence[str] = (),
    workers: int | None = None,
    groups: int = 1,
    ps_shards: int = 1,
    throughputs: Sequence[float] | None = None,
    group_timeout: float = 60.0,
    checkpoint_every: float = 30.0,
    measure_momentum: bool = False,
    compensate_asynchrony: bool = True,
    token: str | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    profile: ClusterProfile | str | os.PathLike[str] | None = None,
    merge: bool = True,
    shared_memory: bool = True,
    emulate: ClusterSpec | str | None = None,
    faults: Sequence[FaultSpec | str] = (),
    ray: bool | str = False,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
) -> int:
    """Runs `script` on a local cluster, or on a Ray cluster, and returns its exit status.

    Starts `ps_shards` parameter servers and `workers` processes of `script`, each told its
    place through `OMNIKERAS_CONFIG`. On a host with no visible GPU it starts one process
    per group instead (the batch-merging CPU path, see `plan_workers`), and says so on
    stderr; `merge=False` turns this off. Each process gets measured CPU thread settings:
    the profile's, else ones measured once per machine and cached (unless
    `TF_NUM_INTRAOP_THREADS` and `TF_NUM_INTEROP_THREADS` are set, which win). The chief's (worker 0's) output streams to this
    process; the others' and the servers' go to log files. A parameter server that dies
    is restarted on its checkpoint directory (written every `checkpoint_every` seconds),
    on the same port: the workers reconnect and carry on from its checkpoint. Another
    worker that dies is restarted and joins its group again; until then its group
    carries on without it. Each process is restarted at most `MAX_RESTARTS` times. If the
    chief fails, everything stops with a message naming it and its log. No process is
    left behind, also on Ctrl-C.

    With `emulate`, the cluster runs on emulated hosts (see `omnikeras.emulation`): every
    process inside a private network namespace made for the run, each host's worker in
    cgroups that cap its CPU, the parameter servers behind a link shaped to the spec's
    bandwidth, and the spec's faults (and `faults`) injected on schedule, each reported
    on stderr and in `faults.log`. Each host is one device: its workers train as one
    process. Workers talk to the servers over gRPC, as across hosts. The namespace and
    cgroups are removed at the end, also on failure and Ctrl-C.

    Args:
        script: Path of the training script.
        script_args: Arguments passed to every worker's script.
        workers: Number of worker processes. Defaults to 4, or with `emulate` the spec's
            workers (it must match when given).
        groups: Number of compute groups. Defaults to 1 (synchronous).
        ps_shards: Number of parameter-server processes. Defaults to 1.
        throughputs: Examples/s of each worker, which sizes its share of its group's
            batch; None (the default) takes them from `profile`, or gives equal shares.
        group_timeout: Seconds a group waits for a missing member. Defaults to 60.
        checkpoint_every: Seconds between the servers' checkpoints, which bound what a
            server's restart loses. Defaults to 30.
        measure_momentum: The servers measure the total momentum of their updates
            (`total_momentum` in their stats), at tens of microseconds per update.
            Defaults to False.
        compensate_asynchrony: With more than one group, the servers steer the momentum
            and learning rate in force so that the updates' total momentum and effective
            step are the compiled ones (see `GroupedAsyncStrategy`). Defaults to True;
            False applies the compiled settings as they are.
        token: Shared secret between servers and workers; None (the default) uses none.
        log_dir: Directory for the logs; defaults to `runs/launch-<time>`.
        seed: Seed of the data shuffle shared by the workers. Defaults to 0.
        profile: A `ClusterProfile` of this host, or the path of its JSON (written by
            `omnikeras profile`): sizes the batch shares and sets the thread settings.
        merge: Merge the co-located workers of each group into one process on a CPU
            host. Defaults to True; it has no effect where a GPU is visible.
        shared_memory: Workers exchange gradients and weights with the servers through
            shared memory. Defaults to True; False sends them over gRPC.
        emulate: A `ClusterSpec`, the name of a built-in one (`cpu-cluster-1gbit`,
            `mixed`) or a spec file to emulate; None (the default) runs on this machine as
            it is.
        faults: More faults to inject into the emulated cluster, as `FaultSpec`s or in the
            command line's form `KIND:TARGET@AT[+SECONDS]`.
        ray: Run on a Ray cluster (needs `omnikeras[ray]`): True joins this machine's
            cluster, or starts one on its loopback; a string is the address of the
            cluster to join, refused within seconds where nothing answers (see
            `ray_address`). The servers and workers run as Ray actors, one worker per GPU
            and one merged worker per CPU node (one per CPU with `merge=False`); `workers`
            defaults to all of them, at least one per group, and more share the CPU
            nodes' CPUs (see `plan_ray_cluster`). Where GPU and CPU workers mix and `throughputs` is
            None, each kind of node is profiled once and the profile cached. Each actor runs its process as locally, which dies
            with it; Ray restarts a dead server's actor on its node, port and
            checkpoints, and a dead worker's actor, which rejoins its group. A token is
            made when none is given. The logs are in `log_dir` on each actor's node.
            Defaults to False.
        tls_cert, tls_key: PEM certificate and key the servers serve TLS with; None (the
            default) serves without TLS. Both or neither.
        tls_ca: PEM certificate of the CA the workers trust; defaults to `tls_cert`, for a
            self-signed certificate.

    Returns:
        0 if every worker finished, the chief's status if it failed, 1 if another
        process failed.

    Example:

    >>> launch("examples/fashion_mnist.py", ["--epochs", "1"], workers=4, groups=2)
    0
    """
    tls = TLSFiles.of(tls_cert, tls_key, tls_ca)
    if not checkpoint_every > 0:
        raise ValueError(f"checkpoint_every must be a positive number of seconds, got {checkpoint_every}")
    if not pathlib.Path(script).is_file():
        raise FileNotFoundError(f"no training script at {script}")
    if ray is not False:
        launch_on_ray = _ray_launcher(ray, profile, emulate, faults)
        run_dir = _run_dir(log_dir)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            return launch_on_ray(
                script, script_args, workers, groups, ps_shards, throughputs, group_timeout, checkpoint_every,
                measure_momentum, compensate_asynchrony, token, run_dir, seed, merge, shared_memory, tls,
            )
        except KeyboardInterrupt:
            _say("interrupted: the Ray actors are stopped")
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)
    spec = _emulated_spec(emulate, faults)
    workers = workers if workers is not None or spec is not None else 4
    if (workers is not None and workers < 1) or groups < 1 or ps_shards < 1:
        raise ValueError("workers, groups and ps_shards must be at least 1")
    if spec is None and workers is not None and groups > workers:
        raise ValueError(f"{groups} groups need at least as many workers, got {workers}")
    if throughputs is not None and (spec is not None or len(throughputs) != workers):
        raise ValueError(
            "an emulated cluster's throughputs are its hosts' cores" if spec else f"{len(throughputs)} throughputs for {workers} workers"
        )
    if profile is not None and not isinstance(profile, ClusterProfile):
        profile = ClusterProfile.load(profile)
    if spec is not None:
        plan = plan_emulated_workers(spec, workers, groups)
    else:
        assert workers is not None
        plan = _plan(workers, groups, throughputs, profile, merge)
    if plan.message:
        _say(plan.message)
    log_dir = _run_dir(log_dir)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    with contextlib.ExitStack() as stack:
        try:
            emulation = stack.enter_context(EmulatedCluster(spec)) if spec is not None else None
            cluster = _Cluster(log_dir, token, emulation, tls)
            # Last in, first out: the processes stop before the namespace goes.
            stack.callback(cluster.stop_all)
            addresses = cluster.start_servers(ps_shards, groups, group_timeout, checkpoint_every, measure_momentum)
            for index in range(plan.num_workers):
                config = WorkerConfig(
                    parameter_servers=tuple(addresses),
                    worker_index=index,
                    num_workers=plan.num_workers,
                    throughputs=plan.throughputs,
                    token=token,
                    root_cert=tls.ca if tls else None,
                    seed=seed,
                    # Emulated hosts are apart: they reach the servers through the link.
                    shared_memory=shared_memory and emulation is None,
                    compensate_asynchrony=compensate_asynchrony,
                )
                host = spec.hosts[index] if spec is not None else None
                cluster.start_worker(config, script, script_args, plan.environments[index], host)
            if emulation is not None and spec is not None:
                injector = cluster.fault_injector(spec.faults, addresses, plan.num_workers)
                stack.callback(injector.stop)
                injector.start()
            return cluster.watch()
        except KeyboardInterrupt:
            _say("interrupted: stopping the cluster")
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)


def _ray_launcher(ray: bool | str, profile: object, emulate: object, faults: Sequence[object]) -> Callable[..., int]:
    """`on_ray.launch_on_ray` for the cluster `ray` names, Ray imported; the rest of a
    request that makes no sense on Ray is refused first."""
    if emulate is not None or faults:
        raise ValueError("an emulated cluster runs on this machine, not on Ray: drop emulate (--emulate) or ray (--ray)")
    if profile is not None:
        raise ValueError("a profile describes this machine, not a Ray cluster's nodes: give throughputs (--throughputs)")
    address = ray_address.resolve(ray if isinstance(ray, str) else None, _say)
    try:
        from omnikeras.launcher.on_ray import launch_on_ray
    except ImportError as error:
        raise LaunchError(f"running on Ray needs Ray: pip install 'omnikeras[ray]' ({error})") from None
    return functools.partial(launch_on_ray, address)


def server_args(groups: int, group_timeout: float, checkpoint_every: float, measure_momentum: bool) -> list[str]:
    """The `omnikeras ps` options every launched server gets, locally and on Ray."""
    return [
        "--groups", str(groups), "--group-timeout", str(group_timeout), "--checkpoint-every", str(checkpoint_every),
        *(["--measure-momentum"] if measure_momentum else []),
    ]


def _run_dir(log_dir: str | os.PathLike[str] | None) -> pathlib.Path:
    run_dir = pathlib.Path(log_dir or f"runs/launch-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def _emulated_spec(emulate: ClusterSpec | str | None, faults: Sequence[FaultSpec | str]) -> ClusterSpec | None:
    extra = [fault if isinstance(fault, FaultSpec) else FaultSpec.parse(fault) for fault in faults]
    if emulate is None:
        if extra:
            raise ValueError("faults are injected into an emulated cluster: name one with emulate (--emulate)")
        return None
    spec = emulate if isinstance(emulate, ClusterSpec) else ClusterSpec.load(emulate)
    return spec.with_faults(extra) if extra else spec


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


@dataclass(frozen=True)
class TLSFiles:
    """PEM files of the servers' TLS: their certificate and key, and the certificate of
    the CA the workers trust (the certificate itself where it is self-signed)."""

    cert: str
    key: str
    ca: str

    @classmethod
    def of(
        cls,
        cert: str | os.PathLike[str] | None,
        key: str | os.PathLike[str] | None,
        ca: str | os.PathLike[str] | None,
    ) -> "TLSFiles | None":
        """The files given, checked; None where no certificate is."""
        if (cert is None) != (key is None):
            raise ValueError("TLS needs both a certificate and a key (--tls-cert, --tls-key)")
        if cert is None or key is None:
            if ca is not None:
                raise ValueError("a CA (--tls-ca) is for the servers' certificate: give it too (--tls-cert, --tls-key)")
            return None
        files = cls(str(cert), str(key), str(ca if ca is not None else cert))
        for path in (files.cert, files.key, files.ca):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"no TLS file at {path}")
        return files

    def server_args(self) -> list[str]:
        return ["--tls-cert", self.cert, "--tls-key", self.key]


class Process(Protocol):
    """What the watch reads and does of a server or worker: a local `Child`, or on Ray
    the launcher's view of an actor's process."""

    name: str

    @property
    def returncode(self) -> int | None: ...

    def describe_exit(self) -> str: ...

    def wait_for_output(self, timeout: float = 10.0) -> None: ...

    def terminate(self, grace: float = 10.0) -> None: ...

    def kill(self) -> None: ...


class _Cluster:
    def __init__(
        self, log_dir: pathlib.Path, token: str | None, emulation: EmulatedCluster | None, tls: TLSFiles | None = None
    ) -> None:
        self.log_dir = log_dir
        self.token = token
        self.tls = tls
        self.emulation = emulation
        self.servers: list[Process] = []
        self.workers: list[Process] = []
        self.hosts: dict[str, Child] = {}
        # How each process started, to start it again.
        self._server_args: list[list[str]] = []
        self._worker_starts: list[tuple[WorkerConfig, str, Sequence[str], dict[str, str], HostSpec | None]] = []
        self._restarts: dict[str, int] = {}

    def start_servers(
        self, shards: int, groups: int, group_timeout: float, checkpoint_every: float, measure_momentum: bool
    ) -> list[str]:
        addresses = []
        for shard in range(shards):
            args = [
                *server_args(groups, group_timeout, checkpoint_every, measure_momentum),
                "--checkpoint-dir", str(self.log_dir / f"ps-{shard}-checkpoints"),
                *(self.tls.server_args() if self.tls else []),
            ]
            server, address = self._start_server(shard, args, "w")
            self.servers.append(server)
            # A restart listens where the workers look for it.
            self._server_args.append([*args, "--port", address.rpartition(":")[2]])
            addresses.append(address)
        if self.emulation:
            self.emulation.shape([int(address.rpartition(":")[2]) for address in addresses])
            _say(f"parameter servers at {', '.join(addresses)} in network namespace {self.emulation.name}; logs in {self.log_dir}")
        else:
            _say(f"parameter servers at {', '.join(addresses)}; logs in {self.log_dir}")
        return addresses

    def _start_server(self, shard: int, args: list[str], mode: str) -> tuple[Process, str]:
        env = dict(os.environ)
        if self.token:
            env["OMNIKERAS_TOKEN"] = self.token
        prefix = self.emulation.prefix() if self.emulation else []
        log = open(self.log_dir / f"ps-{shard}.log", mode)
        try:
            return start_parameter_server(args, log, env, name=f"parameter server {shard}", prefix=prefix)
        except ServerStartError as error:
            raise LaunchError(str(error)) from None

    def start_worker(
        self,
        config: WorkerConfig,
        script: str,
        script_args: Sequence[str],
        settings: dict[str, str],
        host: HostSpec | None = None,
    ) -> None:
        self._worker_starts.append((config, script, script_args, settings, host))
        self.workers.append(self._start_worker(config, script, script_args, settings, host, "w"))

    def _start_worker(
        self,
        config: WorkerConfig,
        script: str,
        script_args: Sequence[str],
        settings: dict[str, str],
        host: HostSpec | None,
        mode: str,
    ) -> Process:
        log_path = self.log_dir / f"worker-{config.worker_index}.log"
        name = "the chief (worker 0)" if config.is_chief else f"worker {config.worker_index}"
        if host is not None:
            name += f" on host {host.name}"
        prefix = self.emulation.prefix(host) if self.emulation else []
        worker = start_worker(config, name, python_command(prefix, script, script_args), settings, log_path, mode)
        if host is not None:
            self.hosts[host.name] = worker
        return worker

    def _may_restart(self, child: Process) -> bool:
        count = self._restarts.get(child.name, 0)
        if count >= MAX_RESTARTS:
            return False
        self._restarts[child.name] = count + 1
        return True

    def fault_injector(self, faults: Sequence[FaultSpec], addresses: Sequence[str], workers: int) -> FaultInjector:
        """Injects `faults` into the emulated cluster, timed from when all `workers` have
        joined and the model is initialised: under a CPU cap, a worker's start alone may
        take tens of seconds."""
        emulation = self.emulation
        assert emulation is not None
        log = self.log_dir / "faults.log"
        env = dict(os.environ) | ({"OMNIKERAS_TOKEN": self.token} if self.token else {})
        probe = emulation.command(
            [sys.executable, "-m", "omnikeras.emulation.ready", "--workers", str(workers), *addresses]
        )

        def say(message: str) -> None:
            _say(message)
            with open(log, "a") as file:
                file.write(message + "\n")

        def until_ready(stopping: threading.Event) -> bool:
            waiting = subprocess.Popen(probe, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while waiting.poll() is None:
                if stopping.wait(_POLL_SECONDS):
                    waiting.kill()
                    waiting.wait()
                    return False
            return waiting.returncode == 0

        return FaultInjector(
            emulation, faults, lambda host: self.hosts[host].kill(), lambda shard: self.servers[shard].kill(), say,
            until_ready,
        )

    def watch(self) -> int:
        """Waits for the workers, restarting servers and workers that die; returns the
        cluster's exit status."""
        chief = self.workers[0]
        given_up: set[int] = set()
        while chief.returncode is None:
            for shard, server in enumerate(self.servers):
                if server.returncode is None:
                    continue
                if not self._may_restart(server):
                    raise LaunchError(f"{server.describe_exit()} {MAX_RESTARTS + 1} times: stopping the cluster")
                _say(f"{server.describe_exit()}: restarting it on its checkpoints")
                self.servers[shard], _ = self._start_server(shard, self._server_args[shard], "a")
            for index in range(1, len(self.workers)):
                worker = self.workers[index]
                if worker.returncode in (None, 0) or index in given_up or chief.returncode is not None:
                    continue
                if self._may_restart(worker):
                    _say(f"{worker.describe_exit()}: restarting it; its group carries on until it is back")
                    config, script, script_args, settings, host = self._worker_starts[index]
                    rejoining = dataclasses.replace(config, rejoining=True)
                    self.workers[index] = self._start_worker(rejoining, script, script_args, settings, host, "a")
                else:
                    _say(f"{worker.describe_exit()} {MAX_RESTARTS + 1} times; its group carries on without it")
                    given_up.add(index)
            time.sleep(_POLL_SECONDS)
        chief.wait_for_output()
        if chief.returncode != 0:
            _say(f"{chief.describe_exit()}: stopping the cluster")
            return chief.returncode or 1
        # The chief ended training for everyone; the others follow within a step.
        others = self.workers[1:]
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
