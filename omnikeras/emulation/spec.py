"""What an emulated cluster is made of: hosts with a CPU share, the parameter servers'
link, and the faults to inject, read from a JSON or YAML file or a built-in name."""

import json
import math
import pathlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

FAULT_KINDS = ("pause", "kill_worker", "kill_ps", "cut_link")
_BANDWIDTH = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(bit|kbit|mbit|gbit)\s*$", re.IGNORECASE)
_BITS_PER_UNIT = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_FAULT = re.compile(r"^(?P<kind>[a-z_-]+):(?P<target>[^@]+)@(?P<at>[0-9.]+)(\+(?P<seconds>[0-9.]+))?$")


class SpecError(ValueError):
    """A cluster spec that cannot be emulated; the message says what is wrong."""


@dataclass(frozen=True)
class HostSpec:
    """One emulated host.

    Args:
        name: The host's name, unique in the cluster.
        cpus: The share of the machine's cores it may use (0.25 is a quarter of one core);
            None leaves it uncapped.
        cpuset: The cores it runs on (`"0"`, `"0-1"`), instead of or besides `cpus`.
        workers: Workers on the host. They train as one process, the host being one
            device. Defaults to 1.
    """

    name: str
    cpus: float | None = None
    cpuset: str | None = None
    workers: int = 1

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise SpecError(f"host name {self.name!r}: use letters, digits, '_', '.' and '-'")
        if self.cpus is not None and not (math.isfinite(self.cpus) and self.cpus > 0):
            raise SpecError(f"host {self.name}: cpus must be a positive number, got {self.cpus}")
        if self.cpuset is not None and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", self.cpuset):
            raise SpecError(f"host {self.name}: cpuset must look like '0' or '0-1,3', got {self.cpuset!r}")
        if self.workers < 1:
            raise SpecError(f"host {self.name}: workers must be at least 1, got {self.workers}")

    @property
    def cores(self) -> float:
        """The cores the host may use at most, for its thread settings and its share of
        a group's batch; None-capped hosts count as one core."""
        if self.cpus is not None:
            return self.cpus
        return float(len(cpuset_cores(self.cpuset))) if self.cpuset else 1.0


@dataclass(frozen=True)
class FaultSpec:
    """One fault, `at` seconds after training begins (every worker has joined and the
    model is initialised).

    Args:
        kind: `pause` (freeze a host for `seconds`: a straggler), `kill_worker` (SIGKILL
            the host's worker process), `kill_ps` (SIGKILL a parameter-server shard) or
            `cut_link` (drop every packet to and from a shard for `seconds`).
        at: Seconds after training begins.
        target: The host's name (`pause`, `kill_worker`) or the shard's index (`kill_ps`,
            `cut_link`).
        seconds: How long a pause or a cut lasts.
    """

    kind: str
    at: float
    target: str
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise SpecError(f"fault kind {self.kind!r} is not one of {', '.join(FAULT_KINDS)}")
        if not (math.isfinite(self.at) and self.at >= 0):
            raise SpecError(f"{self.kind} fault: at must be a number of seconds >= 0, got {self.at}")
        lasting = self.kind in ("pause", "cut_link")
        if lasting and not (math.isfinite(self.seconds) and self.seconds > 0):
            raise SpecError(f"{self.kind} fault: seconds must be positive, got {self.seconds}")
        if self.kind in ("kill_ps", "cut_link") and not self.target.isdigit():
            raise SpecError(f"{self.kind} fault: the target is a shard index, got {self.target!r}")

    @classmethod
    def parse(cls, text: str) -> "FaultSpec":
        """Reads the command line's form, `KIND:TARGET@AT[+SECONDS]`.

        Example:

        >>> FaultSpec.parse("pause:slow-1@20+5")
        FaultSpec(kind='pause', at=20.0, target='slow-1', seconds=5.0)
        """
        match = _FAULT.match(text.strip())
        if match is None:
            raise SpecError(f"fault {text!r}: expected KIND:TARGET@AT[+SECONDS], as in pause:slow-1@20+5")
        return cls(
            kind=match["kind"].replace("-", "_"),
            at=float(match["at"]),
            target=match["target"],
            seconds=float(match["seconds"] or 0.0),
        )

    def describe(self) -> str:
        """What the fault does, in words: `"pause host slow-1 for 5 s"`."""
        return {
            "pause": f"pause host {self.target} for {self.seconds:g} s",
            "kill_worker": f"kill the worker of host {self.target}",
            "kill_ps": f"kill parameter server {self.target}",
            "cut_link": f"cut the link of parameter server {self.target} for {self.seconds:g} s",
        }[self.kind]


@dataclass(frozen=True)
class ClusterSpec:
    """An emulated cluster: its hosts, the link that connects each parameter server to
    the workers, and the faults to inject.

    A spec file (JSON, or YAML for `.yaml`/`.yml`) holds the same fields:

    ```yaml
    link: 1gbit            # each parameter server's link, per direction
    hosts:
      - {name: fast, cpus: 1.0}
      - {name: slow, cpus: 0.25, count: 4}   # slow-0 ... slow-3
    faults:
      - {kind: pause, target: slow-1, at: 20, seconds: 5}
    ```

    Args:
        name: The spec's name (a built-in's, or the file's stem).
        hosts: The worker hosts.
        link_bits_per_second: Bandwidth of each parameter server's link, each direction.
        faults: Faults to inject while the run trains.
    """

    name: str
    hosts: tuple[HostSpec, ...]
    link_bits_per_second: float
    faults: tuple[FaultSpec, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.hosts:
            raise SpecError(f"spec {self.name}: no hosts")
        names = [host.name for host in self.hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise SpecError(f"spec {self.name}: host names {duplicates} appear more than once")
        if not (math.isfinite(self.link_bits_per_second) and self.link_bits_per_second > 0):
            raise SpecError(f"spec {self.name}: the link's bandwidth must be positive")
        for fault in self.faults:
            if fault.kind in ("pause", "kill_worker") and fault.target not in names:
                raise SpecError(f"fault '{fault.describe()}': no host {fault.target!r} in spec {self.name}")

    @property
    def workers(self) -> int:
        return sum(host.workers for host in self.hosts)

    def with_faults(self, faults: Sequence[FaultSpec]) -> "ClusterSpec":
        return ClusterSpec(self.name, self.hosts, self.link_bits_per_second, (*self.faults, *faults))

    @classmethod
    def load(cls, source: str) -> "ClusterSpec":
        """A built-in spec by name (`cpu-cluster-1gbit`, `mixed`), or a spec file.

        Example:

        >>> ClusterSpec.load("cpu-cluster-1gbit").workers
        8
        """
        if source in BUILT_IN:
            return cls.from_dict(source, BUILT_IN[source])
        path = pathlib.Path(source)
        if not path.is_file():
            raise SpecError(f"{source!r} is neither a built-in spec ({', '.join(BUILT_IN)}) nor a file")
        text = path.read_text()
        try:
            fields = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
        except (yaml.YAMLError, json.JSONDecodeError) as error:
            raise SpecError(f"{path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: {error}") from None
        return cls.from_dict(path.stem, fields)

    @classmethod
    def from_dict(cls, name: str, fields: Any) -> "ClusterSpec":
        if not isinstance(fields, Mapping):
            raise SpecError(f"spec {name}: expected a mapping with 'link' and 'hosts'")
        unknown = fields.keys() - {"link", "hosts", "faults"}
        if unknown:
            raise SpecError(f"spec {name}: unknown keys {sorted(unknown)}; known: faults, hosts, link")
        if "link" not in fields or "hosts" not in fields:
            raise SpecError(f"spec {name}: 'link' and 'hosts' are required")
        hosts = [host for entry in _list(name, "hosts", fields["hosts"]) for host in _hosts(name, entry)]
        faults = [_fault(name, entry) for entry in _list(name, "faults", fields.get("faults") or [])]
        return cls(name, tuple(hosts), parse_bandwidth(fields["link"]), tuple(faults))


def parse_bandwidth(text: Any) -> float:
    """Bits per second of `"1gbit"`, `"100mbit"`, `"500kbit"` (tc's units).

    Example:

    >>> parse_bandwidth("1gbit")
    1000000000.0
    """
    match = _BANDWIDTH.match(str(text))
    if match is None:
        raise SpecError(f"bandwidth {text!r}: expected a number and one of bit, kbit, mbit, gbit, as in 1gbit")
    return float(match[1]) * _BITS_PER_UNIT[match[2].lower()]


def cpuset_cores(cpuset: str) -> list[int]:
    cores: list[int] = []
    for part in cpuset.split(","):
        first, _, last = part.partition("-")
        cores.extend(range(int(first), int(last or first) + 1))
    return cores


def _list(name: str, key: str, value: Any) -> list:
    if not isinstance(value, list):
        raise SpecError(f"spec {name}: '{key}' must be a list")
    return value


def _hosts(name: str, entry: Any) -> list[HostSpec]:
    if not isinstance(entry, Mapping):
        raise SpecError(f"spec {name}: each host is a mapping, got {entry!r}")
    unknown = entry.keys() - {"name", "cpus", "cpuset", "workers", "count"}
    if unknown:
        raise SpecError(f"spec {name}: host keys {sorted(unknown)} unknown; known: count, cpus, cpuset, name, workers")
    if "name" not in entry:
        raise SpecError(f"spec {name}: a host without a name: {dict(entry)}")
    settings = {k: entry[k] for k in ("cpus", "cpuset", "workers") if k in entry}
    if "cpus" in settings:
        settings["cpus"] = _number(name, "cpus", settings["cpus"])
    if "cpuset" in settings:
        settings["cpuset"] = str(settings["cpuset"])
    count = entry.get("count")
    if count is None:
        return [HostSpec(str(entry["name"]), **settings)]
    if not isinstance(count, int) or count < 1:
        raise SpecError(f"spec {name}: host {entry['name']}: count must be a positive integer")
    return [HostSpec(f"{entry['name']}-{index}", **settings) for index in range(count)]


def _fault(name: str, entry: Any) -> FaultSpec:
    if not isinstance(entry, Mapping):
        raise SpecError(f"spec {name}: each fault is a mapping, got {entry!r}")
    unknown = entry.keys() - {"kind", "at", "target", "seconds"}
    missing = {"kind", "at", "target"} - entry.keys()
    if unknown or missing:
        raise SpecError(f"spec {name}: a fault has keys kind, at, target and, for pause and cut_link, seconds; got {dict(entry)}")
    return FaultSpec(
        str(entry["kind"]),
        _number(name, "at", entry["at"]),
        str(entry["target"]),
        _number(name, "seconds", entry.get("seconds", 0.0)),
    )


def _number(name: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"spec {name}: {key} must be a number, got {value!r}")
    return float(value)


BUILT_IN: dict[str, dict[str, Any]] = {
    # The paper's CPU cluster, scaled to this machine: eight small hosts behind 1 Gbit/s.
    "cpu-cluster-1gbit": {"link": "1gbit", "hosts": [{"name": "cpu", "cpus": 0.25, "count": 8}]},
    # One fast device (a whole core) and four slow ones.
    "mixed": {"link": "1gbit", "hosts": [{"name": "fast", "cpus": 1.0}, {"name": "slow", "cpus": 0.25, "count": 4}]},
}
