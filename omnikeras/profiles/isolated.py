"""One throughput measurement in a fresh process, under given thread settings and device."""

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from omnikeras.profiles.threads import ThreadSettings

# Marks the child's progress lines among whatever else it writes to stderr.
_PROGRESS = "[omnikeras-progress] "


@dataclass(frozen=True)
class Measurement:
    """What a measuring process reports.

    Args:
        examples_per_second: The median throughput at each batch size measured.
        parameters: `(shape, dtype)` of each trainable variable of the model.
    """

    examples_per_second: tuple[float, ...]
    parameters: tuple[tuple[tuple[int, ...], str], ...]


def measure_isolated(
    model: str,
    batch_sizes: Sequence[int],
    threads: ThreadSettings | None = None,
    device: str = "/CPU:0",
    repeats: int = 5,
    seconds: float = 1.0,
    label: str = "",
    timeout: float = 1800.0,
) -> Measurement:
    """Measures `model`'s training throughput in a child process that sees only `device`.

    Progress lines go to this process's stderr as the child measures.

    Args:
        model: `MODULE:FUNCTION` that builds the model.
        batch_sizes: The batch sizes to measure.
        threads: TensorFlow's intra- and inter-op threads in the child; None leaves
            TensorFlow's defaults.
        device: `"/CPU:0"` (the child sees no GPU) or `"/GPU:i"` (it sees GPU i only).
        repeats, seconds: Timed runs per batch size, and about how long each lasts.
        label: Prefix of the progress lines.
        timeout: Seconds before the child is given up.

    Example:

    >>> measure_isolated("omnikeras.profiles.reference_cnn:reference_cnn", [32],
    ...                  ThreadSettings(2, 1), repeats=3, seconds=0.5).examples_per_second
    (1012.4,)

    Raises:
        RuntimeError: The child failed; the message holds the end of its stderr.
    """
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if threads is not None:
        env |= threads.environment()
    kind, _, index = device.strip("/").partition(":")
    env["CUDA_VISIBLE_DEVICES"] = index if kind.upper() == "GPU" else "-1"
    command = [
        sys.executable, "-m", "omnikeras.profiles.throughput", "--model", model,
        "--batch-sizes", ",".join(str(b) for b in batch_sizes),
        "--repeats", str(repeats), "--seconds", str(seconds), "--label", _PROGRESS + label,
    ]
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # TensorFlow's own start-up chatter stays behind; the progress lines go through.
        stderr_tail: list[str] = []
        assert child.stderr is not None and child.stdout is not None
        for line in child.stderr:
            if line.startswith(_PROGRESS):
                print(line.removeprefix(_PROGRESS), end="", file=sys.stderr, flush=True)
            else:
                stderr_tail = [*stderr_tail[-20:], line]
        stdout = child.stdout.read()
        returncode = child.wait(timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    lines = stdout.strip().splitlines()
    if returncode != 0 or not lines:
        raise RuntimeError(
            f"measuring {model} on {device} failed with exit code {returncode}:\n" + "".join(stderr_tail)
        )
    reply = json.loads(lines[-1])
    return Measurement(
        examples_per_second=tuple(reply["examples_per_second"]),
        parameters=tuple((tuple(shape), dtype) for shape, dtype in reply["parameters"]),
    )
