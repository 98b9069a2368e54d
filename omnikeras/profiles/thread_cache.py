"""CPU thread settings measured once per machine and kept in a cache file."""

import importlib.metadata
import json
import os
import pathlib
import socket
from collections.abc import Callable

from omnikeras.profiles.hardware import cpu_count
from omnikeras.profiles.model_spec import REFERENCE
from omnikeras.profiles.thread_search import search_thread_settings
from omnikeras.profiles.threads import ThreadSettings

CACHE_FILE = "cpu-threads.json"
_PROBE_BATCH = 64


def cache_dir() -> pathlib.Path:
    """`$OMNIKERAS_CACHE_DIR`, else `$XDG_CACHE_HOME/omnikeras`, else `~/.cache/omnikeras`."""
    if os.environ.get("OMNIKERAS_CACHE_DIR"):
        return pathlib.Path(os.environ["OMNIKERAS_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "omnikeras"


def cached_thread_settings(say: Callable[[str], None] = lambda message: None) -> ThreadSettings:
    """The thread settings under which the reference CNN trains fastest on this machine's
    CPU, measured on first use and read from the cache afterwards.

    The cache is keyed by host name, core count and TensorFlow version, the things that
    change the answer. The measurement runs one short training per candidate setting, in
    fresh processes, and takes about ten seconds per candidate; `say` is told before it
    starts. `omnikeras profile --model` measures for a given model instead.

    Example:

    >>> cached_thread_settings(print)
    ThreadSettings(intra_op=2, inter_op=1)
    """
    path = cache_dir() / CACHE_FILE
    key = f"{socket.gethostname()}, {cpu_count()} cores, tensorflow {_tensorflow_version()}"
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        entries = {}
    if not isinstance(entries, dict):
        entries = {}
    if key in entries:
        try:
            return ThreadSettings(**entries[key])
        except (TypeError, ValueError):
            pass
    say(f"measuring the CPU thread settings once, for {key}; the result is cached in {path}")
    best, _ = search_thread_settings(REFERENCE, _PROBE_BATCH, repeats=3, seconds=0.5, label="  ")
    entries[key] = {"intra_op": best.intra_op, "inter_op": best.inter_op}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(entries, indent=2))
    # Atomic: two launchers measuring at once each leave a whole file.
    temporary.replace(path)
    return best


def _tensorflow_version() -> str:
    try:
        return importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
