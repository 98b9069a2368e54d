"""`launch(..., ray=...)`: the parameter servers and workers of a run as actors of a Ray
cluster, watched and restarted as the local launcher watches its processes."""

import dataclasses
import importlib.metadata
import json
import logging
import os
import pathlib
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from omnikeras.config import WorkerConfig
from omnikeras.launcher import launcher
from omnikeras.launcher.launcher import MAX_RESTARTS, LaunchError, TLSFiles
from omnikeras.launcher.ray_actors import ServerActor, WorkerActor
from omnikeras.launcher.ray_plan import RayNode, RayPlan, Slot, node_kind, plan_ray_cluster
from omnikeras.profiles.profile import ClusterProfile
from omnikeras.profiles.thread_cache import cache_dir

_POLL_SECONDS = 0.1
# Where the launcher's actors are named: `<run directory name>:ps-<shard>` and
# `<run directory name>:worker-<index>`, for `ray.get_actor(name, namespace=NAMESPACE)`.
NAMESPACE = "omnikeras"
# Profiles of the kinds of Ray nodes, in the cache directory.
PROFILES_FILE = "ray-node-profiles.json"
# How long actors may take to be placed and to start their process.
_START_SECONDS = 180.0


def connect(address: str | None) -> Callable[[], None]:
    """Joins the Ray cluster at `address`, or with None starts one on this machine (unless
    this process is connected to one already); returns what disconnects, and stops a
    cluster started here."""
    if ray.is_initialized():
        return lambda: None
    if address is None:
        # "local": a new cluster, even where Ray's file names one that is gone.
        ray.init(
            address="local", include_dashboard=False, namespace=NAMESPACE, logging_level=logging.WARNING,
            log_to_driver=False,
        )
    else:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
    return ray.shutdown


def live_nodes() -> list[RayNode]:
    """The cluster's live nodes with their logical CPUs and GPUs; a node's kind names
    them and its accelerator type."""
    nodes = []
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        resources = node["Resources"]
        cpus, gpus = float(resources.get("CPU", 0)), int(resources.get("GPU", 0))
        accelerators = sorted(k.removeprefix("accelerator_type:") for k in resources if k.startswith("accelerator_type:"))
        nodes.append(RayNode(node["NodeID"], cpus, gpus, node_kind(cpus, gpus, accelerators)))
    return nodes


def _profile_on_node() -> str:
    """`omnikeras profile` of the reference CNN on the node this task runs on, as JSON."""
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "profile.json")
        subprocess.run(
            [sys.executable, "-m", "omnikeras", "profile", "--repeats", "3", "--seconds", "0.5", "--out", out],
            check=True, capture_output=True, timeout=1800,
        )
        return pathlib.Path(out).read_text()


class NodeProfiles:
    """Profiles of the kinds of Ray nodes, measured once per kind (with `measure`, by
    default `omnikeras profile` as a Ray task on a node of that kind) and kept in `path`."""

    def __init__(self, path: pathlib.Path, measure: Callable[[RayNode], str] | None = None) -> None:
        self.path = path
        self._measure = measure or _measure_on

    def __call__(self, node: RayNode) -> ClusterProfile:
        key = f"{node.kind}, tensorflow {_tensorflow_version()}"
        try:
            cached = json.loads(self.path.read_text())
        except (OSError, ValueError):
            cached = {}
        if not isinstance(cached, dict):
            cached = {}
        if key in cached:
            return ClusterProfile.from_json(cached[key])
        launcher._say(f"profiling a node of {node.kind} once; the profile is kept in {self.path}")
        profile = self._measure(node)
        cached[key] = profile
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(cached, indent=2))
        temporary.replace(self.path)
        return ClusterProfile.from_json(profile)


def _measure_on(node: RayNode) -> str:
    task = ray.remote(_profile_on_node).options(
        num_cpus=node.cpus,
        num_gpus=node.gpus,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
    )
    return str(ray.get(task.remote()))


def _tensorflow_version() -> str:
    try:
        return importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class ActorChild:
    """The launcher's view of an actor's process, polled in the background: what the
    launcher's watch reads of a local `Child`. The chief's output goes to the console."""

    def __init__(self, name: str, actor: Any, log_path: pathlib.Path, start: str) -> None:
        self.name = name
        self.actor = actor
        self.log_path = str(log_path)
        self._lock = threading.Lock()
        self._start: str | None = start
        self._returncode: int | None = None
        self._actor_died = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def actor_died(self) -> bool:
        """Whether the actor is gone for good: Ray restarts it no more."""
        return self._actor_died

    def restarted(self, actor: Any, start: str) -> None:
        """The process runs again, as `start`, in `actor`."""
        with self._lock:
            self.actor, self._start, self._returncode, self._actor_died = actor, start, None, False

    def _poll(self) -> None:
        pending = None
        while not self._stopping.is_set():
            actor = self.actor
            pending = pending or actor.poll.remote()
            try:
                report = ray.get(pending, timeout=1.0)
            except GetTimeoutError:
                continue
            except ActorUnavailableError:
                if self._start is not None:
                    launcher._say(f"the Ray actor of {self.name} is unavailable: Ray restarts it if it died")
                with self._lock:
                    # A restarted actor starts its process anew, under a start unknown here.
                    if actor is self.actor:
                        self._start = None
                pending = None
                time.sleep(0.5)
                continue
            except ActorDiedError:
                with self._lock:
                    if actor is self.actor:
                        self._returncode, self._actor_died = -9, True
                pending = None
                time.sleep(_POLL_SECONDS)
                continue
            pending = None
            with self._lock:
                if actor is not self.actor or (self._start is not None and report.start != self._start):
                    continue
                self._start = report.start
                if report.stdout:
                    sys.stdout.buffer.write(report.stdout)
                    sys.stdout.buffer.flush()
                if report.stderr:
                    sys.stderr.buffer.write(report.stderr)
                    sys.stderr.buffer.flush()
                self._returncode = report.returncode
            time.sleep(_POLL_SECONDS)

    def wait_for_output(self, timeout: float = 10.0) -> None:
        """Nothing to wait for: a poll that says the process ended carries all it printed."""

    def describe_exit(self) -> str:
        code = self._returncode
        if self._actor_died:
            how = "lost its Ray actor, which Ray restarts no more"
        elif code is not None and code < 0:
            how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return f"{self.name} {how} (log: {self.log_path} on its node)"

    def terminate(self, grace: float = 10.0) -> None:
        """Stops the process, then the actor, for good."""
        self._stopping.set()
        try:
            ray.get(self.actor.stop.remote(), timeout=grace + 5)
        except Exception:
            # A dead or unreachable actor has nothing left to stop but itself.
            pass
        ray.kill(self.actor, no_restart=True)

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)


class RayCluster(launcher._Cluster):
    """Parameter servers and workers as Ray actors placed by `plan`; `watch` as locally."""

    def __init__(self, log_dir: pathlib.Path, token: str, plan: RayPlan, tls: TLSFiles | None) -> None:
        super().__init__(log_dir, token, None, tls)
        self.plan = plan
        self.token = token
        # The files may be on this machine alone: their contents travel to the actors.
        self._server_tls = (_read(tls.cert), _read(tls.key)) if tls else None
        self._worker_ca = _read(tls.ca) if tls else None
        self._server_actor: Any = ray.remote(ServerActor)
        self._worker_actor: Any = ray.remote(WorkerActor)

    def _name(self, actor: str) -> str:
        return f"{self.log_dir.name}:{actor}"

    def _options(self, name: str, slot: Slot, restarts: int) -> dict:
        return {
            "name": self._name(name),
            "namespace": NAMESPACE,
            "num_cpus": slot.num_cpus,
            "num_gpus": slot.num_gpus,
            "max_restarts": restarts,
            "max_task_retries": 0,
            # Its node if alive (its checkpoints are there), else any node with room.
            "scheduling_strategy": NodeAffinitySchedulingStrategy(slot.node_id, soft=True),
        }

    def start_servers(
        self, shards: int, groups: int, group_timeout: float, checkpoint_every: float, measure_momentum: bool
    ) -> list[str]:
        args = launcher.server_args(groups, group_timeout, checkpoint_every, measure_momentum)
        actors = [
            self._server_actor.options(**self._options(f"ps-{shard}", slot, MAX_RESTARTS)).remote(
                shard, args, str(self.log_dir / f"ps-{shard}-checkpoints"), str(self.log_dir / f"ps-{shard}.log"), self.token,
                self._server_tls,
            )
            for shard, slot in enumerate(self.plan.servers)
        ]
        addresses = _get([actor.address.remote() for actor in actors], "the parameter servers")
        reports = _get([actor.poll.remote() for actor in actors], "the parameter servers")
        for shard, (actor, report) in enumerate(zip(actors, reports)):
            self.servers.append(ActorChild(f"parameter server {shard}", actor, self.log_dir / f"ps-{shard}.log", report.start))
        launcher._say(f"parameter servers at {', '.join(addresses)}; logs in {self.log_dir} on their nodes")
        return addresses

    def _start_server(self, shard: int, args: list[str], mode: str) -> tuple[ActorChild, str]:
        server = cast(ActorChild, self.servers[shard])
        if server.actor_died:
            raise LaunchError(f"{server.describe_exit()}: stopping the cluster")
        start, address = _get(server.actor.restart.remote(), str(server.name))
        server.restarted(server.actor, start)
        return server, address

    def start_worker(self, config: WorkerConfig, script: str, script_args: Sequence[str], settings: dict[str, str], host: object = None) -> None:
        self._worker_starts.append((config, script, script_args, settings, None))
        self.workers.append(self._new_worker(config, script, script_args, settings))

    def _new_worker(self, config: WorkerConfig, script: str, script_args: Sequence[str], settings: dict[str, str]) -> ActorChild:
        slot = self.plan.workers[config.worker_index]
        name = "the chief (worker 0)" if config.is_chief else f"worker {config.worker_index}"
        log_path = self.log_dir / f"worker-{config.worker_index}.log"
        # The chief is not restarted, here as locally: it alone initialises the model.
        restarts = 0 if config.is_chief else MAX_RESTARTS
        actor = self._worker_actor.options(**self._options(f"worker-{config.worker_index}", slot, restarts)).remote(
            config, [self._name(f"ps-{shard}") for shard in range(len(self.servers))], script, list(script_args), settings,
            str(log_path), name, os.getcwd(), self._worker_ca,
        )
        report = _get(actor.poll.remote(), name)
        return ActorChild(name, actor, log_path, report.start)

    def _start_worker(
        self, config: WorkerConfig, script: str, script_args: Sequence[str], settings: dict[str, str], host: object, mode: str
    ) -> ActorChild:
        worker = cast(ActorChild, self.workers[config.worker_index])
        addresses = _get([cast(ActorChild, server).actor.address.remote() for server in self.servers], "the parameter servers")
        config = dataclasses.replace(config, parameter_servers=tuple(addresses))
        if worker.actor_died:
            fresh = self._new_worker(config, script, script_args, settings)
            worker.terminate()
            return fresh
        worker.restarted(worker.actor, _get(worker.actor.restart.remote(config), worker.name))
        return worker


def _read(path: str) -> bytes:
    return pathlib.Path(path).read_bytes()


def _get(refs: Any, what: str) -> Any:
    try:
        return ray.get(refs, timeout=_START_SECONDS)
    except GetTimeoutError:
        raise LaunchError(
            f"{what} did not start within {_START_SECONDS:g} s: the Ray cluster may lack the resources "
            "(other jobs holding them?)"
        ) from None


def launch_on_ray(
    address: str | None,
    script: str,
    script_args: Sequence[str],
    workers: int | None,
    groups: int,
    ps_shards: int,
    throughputs: Sequence[float] | None,
    group_timeout: float,
    checkpoint_every: float,
    measure_momentum: bool,
    compensate_asynchrony: bool,
    token: str | None,
    log_dir: pathlib.Path,
    seed: int,
    merge: bool,
    shared_memory: bool,
    tls: TLSFiles | None,
) -> int:
    """The Ray half of `launch`: see its docstring; `address` is the cluster's (None:
    start one here), as `ray_address.resolve` found it."""
    disconnect = connect(address)
    try:
        profiles = NodeProfiles(cache_dir() / PROFILES_FILE)
        plan = plan_ray_cluster(live_nodes(), workers, groups, ps_shards, merge, throughputs, profiles)
        launcher._say(plan.message)
        # Actors run on machines that may be shared: a token unless one was given.
        token = token or secrets.token_urlsafe(32)
        cluster = RayCluster(log_dir.absolute(), token, plan, tls)
        try:
            addresses = cluster.start_servers(ps_shards, groups, group_timeout, checkpoint_every, measure_momentum)
            for index, environment in enumerate(plan.environments):
                config = WorkerConfig(
                    parameter_servers=tuple(addresses),
                    worker_index=index,
                    num_workers=len(plan.workers),
                    throughputs=plan.throughputs,
                    token=token,
                    seed=seed,
                    shared_memory=shared_memory,
                    compensate_asynchrony=compensate_asynchrony,
                )
                cluster.start_worker(config, os.path.abspath(script), script_args, environment)
            return cluster.watch()
        finally:
            cluster.stop_all()
    finally:
        disconnect()
