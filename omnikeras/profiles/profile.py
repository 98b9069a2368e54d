"""Device profiles: each device as a black box with a measured throughput.

A profile holds, for one model, every local device's training throughput (examples/s)
over a range of batch sizes, the thread settings that served it best, and the parameter
server's push_pull time for the model's size. The launcher sizes each member's batch
share from it, and the convergence-time model predicts seconds per update from it.
"""

import dataclasses
import json
import os
import pathlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DeviceProfile:
    """One device's measured training throughput.

    Args:
        name: TensorFlow's device name, like `"/CPU:0"` or `"/GPU:1"`.
        kind: `"CPU"` or `"GPU"`.
        batch_sizes: The batch sizes measured, increasing.
        examples_per_second: The median throughput at each batch size.
        intra_op_threads, inter_op_threads: The thread settings that gave these
            throughputs; None for TensorFlow's defaults.
    """

    name: str
    kind: str
    batch_sizes: tuple[int, ...]
    examples_per_second: tuple[float, ...]
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None

    def __post_init__(self) -> None:
        if len(self.batch_sizes) != len(self.examples_per_second) or not self.batch_sizes:
            raise ValueError(f"{self.name}: one throughput per batch size is needed")
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)) or self.batch_sizes[0] < 1:
            raise ValueError(f"{self.name}: batch sizes must be positive and increasing")
        if not all(np.isfinite(t) and t > 0 for t in self.examples_per_second):
            raise ValueError(f"{self.name}: throughputs must be positive")

    def throughput(self, batch_size: float) -> float:
        """Examples/s at `batch_size`: linear between measured sizes, and outside them
        the nearest measured value (throughput flattens out past the largest batch)."""
        return float(np.interp(batch_size, self.batch_sizes, self.examples_per_second))

    @property
    def peak_throughput(self) -> float:
        """The highest examples/s measured, at whichever batch size."""
        return max(self.examples_per_second)

    def step_seconds(self, batch_size: float) -> float:
        """Seconds to compute the gradient of one batch of `batch_size` examples."""
        return batch_size / self.throughput(batch_size)


@dataclass(frozen=True)
class ClusterProfile:
    """The devices of one machine, measured for one model.

    Args:
        model: What was measured, like `"examples.fashion_mnist:build_model"`.
        parameter_count: The model's trainable parameters.
        devices: Each local device's profile.
        push_pull_seconds: Median time of one push_pull of the model's parameters through
            a parameter server on this machine.
        host: The machine measured.
    """

    model: str
    parameter_count: int
    devices: tuple[DeviceProfile, ...]
    push_pull_seconds: float
    host: str = ""

    @property
    def cpu(self) -> DeviceProfile | None:
        """The CPU's profile, or None if the CPU was not measured."""
        return next((device for device in self.devices if device.kind == "CPU"), None)

    def device(self, name: str) -> DeviceProfile:
        for device in self.devices:
            if device.name == name:
                return device
        raise KeyError(f"no device {name!r} in the profile; it has {[d.name for d in self.devices]}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "ClusterProfile":
        fields = json.loads(text)
        fields["devices"] = tuple(
            DeviceProfile(**(d | {"batch_sizes": tuple(d["batch_sizes"]), "examples_per_second": tuple(d["examples_per_second"])}))
            for d in fields["devices"]
        )
        return cls(**fields)

    def save(self, path: str | os.PathLike[str]) -> None:
        pathlib.Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "ClusterProfile":
        return cls.from_json(pathlib.Path(path).read_text())


def batch_shares(throughputs: list[float], batch_size: int) -> list[int]:
    """Splits `batch_size` rows among devices in proportion to their throughputs, so that
    they finish together; the shares add up to `batch_size` exactly.

    >>> batch_shares([1.0, 3.0], 64)
    [16, 48]
    """
    boundaries = np.round(batch_size * np.concatenate([[0.0], np.cumsum(throughputs)]) / sum(throughputs))
    return np.diff(boundaries).astype(int).tolist()
