"""A worker process of a training script: its place in `OMNIKERAS_CONFIG`, its thread
settings, and the chief's output on a console; for the local launcher and Ray alike."""

import os
import sys
from collections.abc import Mapping, Sequence
from typing import IO

from omnikeras.config import ENV_VAR, WorkerConfig
from omnikeras.processes.child import Child
from omnikeras.processes.console import Sink


def start_worker(
    config: WorkerConfig,
    name: str,
    command: Sequence[str],
    settings: Mapping[str, str],
    log_path: str | os.PathLike[str],
    mode: str,
    console: tuple[Sink, Sink] | None = None,
    die_with_parent: bool = False,
) -> Child:
    """Starts `command` as the worker `config` describes, its output in `log_path` (opened
    with `mode`); the chief's also goes to this process's console, or to `console`.

    `settings` are the plan's variables; thread settings the user exported win over them.
    """
    env = dict(os.environ)
    env[ENV_VAR] = config.to_json()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # A worker that crashes in native code leaves its threads' Python stacks in its log.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    for variable, value in settings.items():
        if variable.startswith("TF_NUM_"):
            env.setdefault(variable, value)
        else:
            env[variable] = value
    if config.is_chief:
        # The chief's output reaches the console, without TensorFlow's start-up lines
        # unless the user asked for them (TF_CPP_MIN_LOG_LEVEL=0).
        quiet = env["TF_CPP_MIN_LOG_LEVEL"] != "0"
        log: IO[bytes] | IO[str] = open(log_path, mode + "b")
        return Child(name, command, env, log, echo=True, quiet=quiet, console=console, die_with_parent=die_with_parent)
    return Child(name, command, env, open(log_path, mode), die_with_parent=die_with_parent)


def python_command(prefix: Sequence[str], script: str, script_args: Sequence[str]) -> list[str]:
    """The command that runs `script` with this Python, after `prefix`."""
    return [*prefix, sys.executable, script, *script_args]
