"""Where a worker process stands in the cluster: read from `OMNIKERAS_CONFIG` or given.

The variable holds JSON, like `TF_CONFIG`, so any scheduler can start the same processes
that `omnikeras launch` starts on one machine:

    OMNIKERAS_CONFIG='{"parameter_servers": ["ps0:50051"], "worker_index": 0,
                       "num_workers": 4}'
"""

import dataclasses
import json
import math
import os
from dataclasses import dataclass

ENV_VAR = "OMNIKERAS_CONFIG"


@dataclass(frozen=True)
class WorkerConfig:
    """One worker's view of the cluster.

    Args:
        parameter_servers: `"host:port"` of every parameter-server shard, in the same order
            on every worker.
        worker_index: This worker's index in `[0, num_workers)`; worker 0 is the chief,
            which initialises the server's weights and runs validation and callbacks.
        num_workers: Number of worker processes in the cluster.
        throughputs: Measured examples/s of every worker, by index; a worker's share of its
            group's batch is proportional to it. None (the default) gives equal shares.
        token: Shared secret of the parameter servers; None (the default) sends none.
        root_cert: PEM file of the CA of the servers' TLS certificates; None (the default)
            connects without TLS.
        seed: Seed of the shuffle that every worker applies alike, so that together they
            read each example once per epoch. Defaults to 0.
        startup_timeout: Seconds to wait for all workers to join and for the chief to
            initialise the model. Defaults to 300.
        finish_timeout: Seconds to wait at the end of `fit` for the other workers to
            finish, before pulling the final weights anyway, and, for a worker other
            than the chief, at an epoch's start for the chief to begin its pass, before
            beginning without it. Defaults to 300.
        shared_memory: Exchange gradients and weights with parameter servers on this host
            through shared memory. Defaults to True; False sends them over gRPC, as to a
            server on another host.
        rejoining: This worker replaces one of its index that died: it joins training
            under way without waiting for the others, or ends at once if the chief has
            ended it. Defaults to False.
        compensate_asynchrony: With more than one group, the servers steer the momentum
            and learning rate in force so that the updates' total momentum and effective
            step are the compiled ones (or the tuner's). Defaults to True; False applies
            the compiled momentum and rate as they are.
    """

    parameter_servers: tuple[str, ...]
    worker_index: int = 0
    num_workers: int = 1
    throughputs: tuple[float, ...] | None = None
    token: str | None = None
    root_cert: str | None = None
    seed: int = 0
    startup_timeout: float = 300.0
    finish_timeout: float = 300.0
    shared_memory: bool = True
    rejoining: bool = False
    compensate_asynchrony: bool = True

    def __post_init__(self) -> None:
        if not self.parameter_servers:
            raise ValueError("parameter_servers must name at least one server address")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {self.num_workers}")
        if not 0 <= self.worker_index < self.num_workers:
            raise ValueError(f"worker_index {self.worker_index} is not in [0, {self.num_workers})")
        if self.throughputs is not None:
            if len(self.throughputs) != self.num_workers:
                raise ValueError(
                    f"throughputs has {len(self.throughputs)} entries for {self.num_workers} workers"
                )
            if not all(math.isfinite(t) and t > 0 for t in self.throughputs):
                raise ValueError(f"throughputs must be positive numbers, got {list(self.throughputs)}")

    @property
    def is_chief(self) -> bool:
        return self.worker_index == 0

    @property
    def worker_id(self) -> int:
        """The id under which the parameter servers know this worker."""
        return self.worker_index + 1

    @property
    def chief_id(self) -> int:
        """The id under which the parameter servers know the chief (worker 0)."""
        return 1

    def throughput_of(self, worker_id: int) -> float:
        return 1.0 if self.throughputs is None else self.throughputs[worker_id - 1]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "WorkerConfig":
        fields = json_object(text, ENV_VAR)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = fields.keys() - known
        if unknown:
            raise ValueError(f"{ENV_VAR} has unknown keys {sorted(unknown)}; known: {sorted(known)}")
        if "parameter_servers" not in fields:
            raise ValueError(f"{ENV_VAR} must name the parameter_servers")
        fields["parameter_servers"] = tuple(fields["parameter_servers"])
        if fields.get("throughputs") is not None:
            fields["throughputs"] = tuple(float(t) for t in fields["throughputs"])
        return cls(**fields)

    @classmethod
    def from_env(cls) -> "WorkerConfig | None":
        text = os.environ.get(ENV_VAR)
        return cls.from_json(text) if text else None


def json_object(text: str, variable: str) -> dict:
    """The JSON object an environment variable holds; ValueError naming it otherwise."""
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{variable} is not valid JSON: {error}") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{variable} must hold a JSON object")
    return fields
