"""What devices this machine has, found without starting TensorFlow.

Importing TensorFlow takes seconds and fixes its thread settings for the rest of the
process, so the launcher and the profiler ask the NVIDIA driver instead.
"""

import os
import pathlib
import shutil
import subprocess


def visible_gpu_count() -> int:
    """The number of NVIDIA GPUs that TensorFlow would see in a child process.

    Reads `nvidia-smi -L`, or else the driver's `/proc/driver/nvidia/gpus`, and honours
    `CUDA_VISIBLE_DEVICES` (empty or `-1` hides every GPU). A machine without the NVIDIA
    driver has none.

    >>> visible_gpu_count() >= 0
    True
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    count = _driver_gpu_count()
    if visible is not None:
        count = min(count, len([part for part in visible.split(",") if part.strip()]))
    return count


def local_devices() -> list[str]:
    """TensorFlow's names of the devices a worker here can train on: the CPU, then each GPU.

    >>> local_devices()[0]
    '/CPU:0'
    """
    return ["/CPU:0", *(f"/GPU:{index}" for index in range(visible_gpu_count()))]


def cpu_count() -> int:
    """The cores this process may run on (its affinity), which a container may limit."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _driver_gpu_count() -> int:
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi:
        try:
            listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            listing = None
        if listing is not None and listing.returncode == 0:
            return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())
    gpus = pathlib.Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0
