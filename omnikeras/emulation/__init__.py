"""An emulated cluster on one machine: hosts with CPU caps in cgroups, the parameter
servers behind a shaped link, all in a private network namespace, and faults on a
schedule. `omnikeras launch --emulate SPEC` runs a training script on one."""

from omnikeras.emulation.cluster import EmulatedCluster, EmulationError, missing_requirements
from omnikeras.emulation.faults import FaultInjector
from omnikeras.emulation.spec import BUILT_IN, ClusterSpec, FaultSpec, HostSpec, SpecError, parse_bandwidth

__all__ = [
    "BUILT_IN",
    "ClusterSpec",
    "EmulatedCluster",
    "EmulationError",
    "FaultInjector",
    "FaultSpec",
    "HostSpec",
    "SpecError",
    "missing_requirements",
    "parse_bandwidth",
]
