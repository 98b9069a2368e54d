"""Checkpoints of the server's state, written atomically into one directory.

Each checkpoint is one `.npz` file (weights, the optimizer's state, the saved snapshots, and a
JSON header with the version, iteration count, hyperparameters (as their proto's JSON),
groups and the next batch to hand out), written to a temporary file and renamed into
place, so a crash mid-write never leaves a torn checkpoint behind. A server started on the same
directory resumes from the newest one.
"""

import json
import os
import pathlib
import tempfile

import numpy as np
from google.protobuf import json_format

from omnikeras.parameter_server.server_state import Arrays, ServerState
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.v1 import parameter_server_pb2 as pb

_PREFIX = "checkpoint-"
_SUFFIX = ".npz"


class CheckpointDirectory:
    def __init__(self, directory: str | os.PathLike[str], keep: int = 3) -> None:
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def save(self, state: ServerState) -> pathlib.Path:
        names = list(state.weights)
        header = {
            "version": state.version,
            "iterations": state.iterations,
            "names": names,
            "hyperparameters": json_format.MessageToDict(
                state.hyperparameters.to_proto(), preserving_proto_field_name=True
            ),
            "num_groups": state.num_groups,
            "assignment": {str(w): g for w, g in state.assignment.items()},
            "next_batch": state.next_batch,
            "snapshots": list(state.snapshots),
            "frozen_names": list(state.frozen_weights),
        }
        arrays = _arrays("", names, (state.weights, state.slots))
        arrays.update({f"f{i}": weight for i, weight in enumerate(state.frozen_weights.values())})
        for number, snapshot in enumerate(state.snapshots.values()):
            arrays.update(_arrays(f"s{number}", names, snapshot))
        path = self.directory / f"{_PREFIX}{state.version:012d}{_SUFFIX}"
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                # NumPy types **kwds as if one could be allow_pickle.
                np.savez(f, header=np.array(json.dumps(header)), **arrays)  # type: ignore[arg-type]
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            pathlib.Path(tmp).unlink(missing_ok=True)
            raise
        self._prune()
        return path

    def latest(self) -> pathlib.Path | None:
        checkpoints = sorted(self.directory.glob(f"{_PREFIX}*{_SUFFIX}"))
        return checkpoints[-1] if checkpoints else None

    def load(self, path: pathlib.Path) -> ServerState:
        with np.load(path) as data:
            header = json.loads(str(data["header"]))
            names = header["names"]
            weights, slots = _read_arrays(data, "", names)
            snapshots = {
                name: _read_arrays(data, f"s{number}", names)
                for number, name in enumerate(header.get("snapshots", []))
            }
            frozen_weights = {name: data[f"f{i}"] for i, name in enumerate(header.get("frozen_names", []))}
        return ServerState(
            weights=weights,
            slots=slots,
            version=header["version"],
            # Older checkpoints did not count iterations; their version is the nearest count.
            iterations=header.get("iterations", header["version"]),
            hyperparameters=Hyperparameters.from_proto(
                json_format.ParseDict(header["hyperparameters"], pb.Hyperparameters())
            ),
            num_groups=header["num_groups"],
            assignment={int(w): g for w, g in header["assignment"].items()},
            next_batch=header.get("next_batch", 0),
            snapshots=snapshots,
            frozen_weights=frozen_weights,
        )

    def _prune(self) -> None:
        for old in sorted(self.directory.glob(f"{_PREFIX}*{_SUFFIX}"))[: -self.keep]:
            old.unlink(missing_ok=True)


# A variable's optimizer state is stored as "<prefix>slot<i>.<slot name>"; SGD's momentum
# as "<prefix>v<i>", as checkpoints stored it before other optimizers had state.
def _slot_key(prefix: str, number: int, slot: str) -> str:
    return f"{prefix}v{number}" if slot == "momentum" else f"{prefix}slot{number}.{slot}"


def _arrays(prefix: str, names: list[str], arrays: Arrays) -> dict[str, np.ndarray]:
    weights, slots = arrays
    stored = {f"{prefix}w{i}": weights[name] for i, name in enumerate(names)}
    for i, name in enumerate(names):
        stored.update({_slot_key(prefix, i, slot): array for slot, array in slots.get(name, {}).items()})
    return stored


def _read_arrays(data: "np.lib.npyio.NpzFile", prefix: str, names: list[str]) -> Arrays:
    weights = {name: data[f"{prefix}w{i}"] for i, name in enumerate(names)}
    slots: dict[str, dict[str, np.ndarray]] = {}
    for i, name in enumerate(names):
        momentum = f"{prefix}v{i}"
        state = {"momentum": data[momentum]} if momentum in data else {}
        start = f"{prefix}slot{i}."
        state.update({key[len(start) :]: data[key] for key in data.files if key.startswith(start)})
        if state:
            slots[name] = state
    return weights, slots
