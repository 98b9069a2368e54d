"""The `omnikeras ps` process keeps the memory it frees for its next step.

Every push and pull over gRPC moves the model's bytes through fresh allocations (the
messages gRPC receives, the reply's encoded chunks). With glibc's defaults, memory freed
at the top of the heap goes back to the kernel and is faulted in again, page by page, at
the next step: 18,000 to 26,000 minor page faults per round trip of 100 MB here, which a
virtual machine makes expensive. Kept for reuse, about 9,500.
"""

import ctypes
import os

# glibc's mallopt parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Below this, allocations come from the heap (glibc's largest dynamic threshold).
MMAP_THRESHOLD = 32 << 20
# Free memory at the top of the heap kept rather than given back.
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Sets the allocator of this process to keep what it frees (see the module's
    description); False where it is not glibc's, or where the user set glibc's own
    variables (`MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`), which win."""
    if "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
