"""A process's place in the cluster from `TF_CONFIG`, as Kubeflow's TFJob, Slurm scripts
and other schedulers write it for TensorFlow:

    TF_CONFIG='{"cluster": {"chief": ["chief-0:2222"], "worker": ["worker-0:2222"],
                            "ps": ["ps-0:2222"]},
                "task": {"type": "worker", "index": 0}}'

The chief (or, without one, worker 0) is omnikeras' worker 0; the other workers follow in
order. `ps` tasks run `omnikeras ps`, which serves on the port of its own address. An
`evaluator` task has no place in training: it is refused.
"""

import os
from dataclasses import dataclass
from typing import Any

from omnikeras.config import WorkerConfig, json_object

ENV_VAR = "TF_CONFIG"
_ROLES = ("chief", "worker", "ps")


@dataclass(frozen=True)
class TFConfig:
    """The cluster `TF_CONFIG` describes, and this process's task in it."""

    chief: tuple[str, ...]
    workers: tuple[str, ...]
    parameter_servers: tuple[str, ...]
    task_type: str
    task_index: int

    @property
    def is_parameter_server(self) -> bool:
        return self.task_type == "ps"

    def worker_config(self, **settings: Any) -> WorkerConfig:
        """This worker's `WorkerConfig`; `settings` fill in the fields `TF_CONFIG` has no
        word for (token, throughputs, seed, ...)."""
        if self.is_parameter_server:
            raise ValueError(f"{ENV_VAR} names this process ps {self.task_index}, not a worker: run `omnikeras ps`")
        index = self.task_index if self.task_type == "chief" else len(self.chief) + self.task_index
        return WorkerConfig(
            self.parameter_servers, worker_index=index, num_workers=len(self.chief) + len(self.workers), **settings
        )

    def server_port(self) -> int:
        """The port this parameter server listens on: its address's."""
        if not self.is_parameter_server:
            raise ValueError(f"{ENV_VAR} names this process {self.task_type} {self.task_index}, not a ps")
        address = self.parameter_servers[self.task_index]
        _, _, port = address.rpartition(":")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{ENV_VAR}: ps {self.task_index} has no port in its address {address!r}")
        return int(port)

    @classmethod
    def from_json(cls, text: str) -> "TFConfig":
        fields = json_object(text, ENV_VAR)
        if not isinstance(fields.get("cluster"), dict):
            raise ValueError(f'{ENV_VAR} must hold a JSON object with a "cluster" object')
        cluster, task = fields["cluster"], fields.get("task")
        unknown = cluster.keys() - {*_ROLES, "evaluator"}
        if unknown:
            raise ValueError(f"{ENV_VAR}: unknown task types {sorted(unknown)} in the cluster; known: {sorted(_ROLES)}")
        addresses = {role: _addresses(cluster, role) for role in _ROLES}
        if len(addresses["chief"]) > 1:
            raise ValueError(f"{ENV_VAR}: a cluster has one chief at most, got {len(addresses['chief'])}")
        if not addresses["ps"]:
            raise ValueError(f'{ENV_VAR}: the cluster names no "ps" task: omnikeras trains through parameter servers')
        if not addresses["chief"] and not addresses["worker"]:
            raise ValueError(f'{ENV_VAR}: the cluster names no "chief" or "worker" task')
        if not isinstance(task, dict) or task.get("type") not in _ROLES or not isinstance(task.get("index"), int):
            raise ValueError(
                f'{ENV_VAR} must give this process\'s "task" as {{"type": one of {list(_ROLES)}, "index": n}}, '
                f"got {task!r}"
            )
        if not 0 <= task["index"] < len(addresses[task["type"]]):
            raise ValueError(
                f"{ENV_VAR}: task {task['type']} {task['index']} is not in the cluster's "
                f"{len(addresses[task['type']])} {task['type']} tasks"
            )
        return cls(addresses["chief"], addresses["worker"], addresses["ps"], task["type"], task["index"])


def _addresses(cluster: dict, role: str) -> tuple[str, ...]:
    addresses = cluster.get(role, [])
    if not isinstance(addresses, list) or not all(isinstance(a, str) and a for a in addresses):
        raise ValueError(f'{ENV_VAR}: cluster "{role}" must be a list of "host:port" strings, got {addresses!r}')
    return tuple(addresses)


def worker_config_from_env() -> WorkerConfig | None:
    """This worker's configuration from `OMNIKERAS_CONFIG`, or else from `TF_CONFIG` (the
    token from `OMNIKERAS_TOKEN`); None when neither is set."""
    config = WorkerConfig.from_env()
    if config is not None:
        return config
    text = os.environ.get(ENV_VAR)
    if not text:
        return None
    return TFConfig.from_json(text).worker_config(token=os.environ.get("OMNIKERAS_TOKEN"))


def parameter_server_from_env() -> TFConfig | None:
    """`TF_CONFIG`, when it is set, checked to name this process a ps task."""
    text = os.environ.get(ENV_VAR)
    if not text:
        return None
    tf_config = TFConfig.from_json(text)
    if not tf_config.is_parameter_server:
        raise ValueError(
            f"{ENV_VAR} names this process {tf_config.task_type} {tf_config.task_index}: run the training script, "
            "not omnikeras ps"
        )
    return tf_config
