"""Child processes of omnikeras (parameter servers, workers, measurements), for the
launcher, the profiler, the benchmarks and the tests alike."""

from omnikeras.processes.child import SERVER_READY, Child, ServerStartError, start_parameter_server

__all__ = ["SERVER_READY", "Child", "ServerStartError", "start_parameter_server"]
