"""The server rebuilds each push's gradients into arrays an earlier push has finished with,
and keeps no more of them than its capacity; its process keeps freed memory for reuse."""

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from omnikeras.parameter_server import Hyperparameters, ParameterServerClient
from omnikeras.parameter_server.buffer_pool import BufferPool


def test_a_pool_hands_out_what_was_given_back_and_keeps_at_most_its_capacity() -> None:
    pool = BufferPool(capacity=1)
    first, second = {"w": np.zeros(2)}, {"w": np.ones(2)}
    pool.give_back(first)
    pool.give_back(second)
    assert pool.take() is first
    assert pool.take() == {}
    # Nothing to keep in an empty set.
    pool.give_back({})
    assert pool.take() == {}


def test_pushes_over_grpc_reuse_the_gradient_arrays_of_earlier_ones(start_server) -> None:
    server = start_server()
    client = ParameterServerClient([server.address], shared_memory=False)
    client.register()
    client.init_model({"w": np.zeros(1000, np.float32)}, Hyperparameters(learning_rate=0.5))
    expected = np.zeros(1000, np.float32)
    for step in range(1, 6):
        gradient = np.full(1000, step, np.float32)
        _, pulled = client.push_pull({"w": gradient}, step=step, example_count=1)
        expected -= np.float32(0.5) * gradient
        # A reused array left over from the step before would show in the weights.
        np.testing.assert_array_equal(pulled.weights["w"], expected)


def _keeps_freed_memory(**variables: str) -> bool:
    # In a process of its own: the setting is the process's for good.
    code = "from omnikeras.parameter_server import allocator; print(allocator.keep_freed_memory())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | variables
    output = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return output.stdout.strip() == "True"


def test_the_servers_process_keeps_freed_memory_unless_glibcs_own_variables_say_otherwise() -> None:
    if not hasattr(ctypes.CDLL(None), "mallopt"):
        pytest.skip("not glibc")
    assert _keeps_freed_memory()
    assert not _keeps_freed_memory(MALLOC_TRIM_THRESHOLD_=str(128 << 10))
