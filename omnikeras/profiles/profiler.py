"""`profile_devices`: the whole measurement behind `omnikeras profile`."""

import socket
import sys
from collections.abc import Sequence

from omnikeras.profiles.hardware import local_devices
from omnikeras.profiles.isolated import measure_isolated
from omnikeras.profiles.model_spec import REFERENCE
from omnikeras.profiles.profile import ClusterProfile, DeviceProfile
from omnikeras.profiles.push_pull import measure_push_pull
from omnikeras.profiles.thread_search import search_thread_settings
from omnikeras.profiles.threads import ThreadSettings

DEFAULT_BATCH_SIZES = (16, 32, 64, 128, 256)
_PREFIX = "omnikeras profile: "


def profile_devices(
    model: str = REFERENCE,
    devices: Sequence[str] | None = None,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    repeats: int = 5,
    seconds: float = 1.0,
    thread_candidates: Sequence[ThreadSettings] | None = None,
) -> ClusterProfile:
    """Measures every local device's training throughput for `model`, and the parameter
    server's push_pull time for its size.

    First the CPU thread settings: each candidate trains `model` at the middle batch size
    in a fresh process, and the fastest wins. Then each device, in a fresh process that
    sees only that device and uses those settings, trains at every batch size. Last, a
    real `omnikeras ps` process times push_pulls of the model's gradients. Progress goes
    to stderr, one line per timed run.

    Args:
        model: `MODULE:FUNCTION` (or `path/file.py:FUNCTION`) that builds the Keras model;
            defaults to the reference CNN on 28x28x1 images.
        devices: TensorFlow device names to measure; defaults to every local device.
        batch_sizes: Increasing batch sizes to measure. Defaults to 16 to 256.
        repeats: Timed runs per measurement, whose median is kept. Defaults to 5.
        seconds: About how long each timed run lasts. Defaults to 1.
        thread_candidates: Thread settings to try; defaults to `candidate_settings()`.

    Example:

    >>> profile = profile_devices(batch_sizes=[32, 128], repeats=3)
    >>> profile.device("/CPU:0").throughput(64)
    1250.0
    """
    batch_sizes = sorted(set(batch_sizes))
    devices = list(devices or local_devices())
    probe = batch_sizes[len(batch_sizes) // 2]
    _say(f"choosing the CPU thread settings for {model} at batch {probe}")
    threads, _ = search_thread_settings(model, probe, thread_candidates, repeats, seconds, _PREFIX)
    _say(f"best: {threads.intra_op} intra-op and {threads.inter_op} inter-op threads")
    measured = []
    parameters: tuple = ()
    for device in devices:
        _say(f"measuring {device} at batch sizes {', '.join(map(str, batch_sizes))}")
        measurement = measure_isolated(model, batch_sizes, threads, device, repeats, seconds, f"{_PREFIX}{device} ")
        parameters = measurement.parameters
        kind = device.strip("/").partition(":")[0].upper()
        measured.append(DeviceProfile(
            name=device,
            kind=kind,
            batch_sizes=tuple(batch_sizes),
            examples_per_second=measurement.examples_per_second,
            intra_op_threads=threads.intra_op,
            inter_op_threads=threads.inter_op,
        ))
    _say("measuring the parameter server's push_pull for the model's size")
    push_pull_seconds = measure_push_pull(parameters, repeats=max(repeats * 4, 10))
    count = sum(_size(shape) for shape, _ in parameters)
    return ClusterProfile(model, count, tuple(measured), push_pull_seconds, host=socket.gethostname())


def _size(shape: Sequence[int]) -> int:
    size = 1
    for dimension in shape:
        size *= dimension
    return size


def _say(message: str) -> None:
    print(f"{_PREFIX}{message}", file=sys.stderr, flush=True)
