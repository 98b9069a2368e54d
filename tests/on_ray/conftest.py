"""A Ray cluster of two nodes on this machine, from Ray's own `cluster_utils`, for the
Ray launcher's end-to-end tests: a head with 2 logical CPUs (the parameter server's and
one worker's) and a second node with 1, on loopback (see ../conftest.py)."""

import os
from collections.abc import Iterator

import pytest

# Before Ray is imported: every node, driver and worker of the test cluster on loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import ray
from ray.cluster_utils import Cluster


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[str]:
    """The address of the cluster; this process is connected to it."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, namespace="omnikeras", logging_level="WARNING", log_to_driver=False)
    yield cluster.address
    ray.shutdown()
    cluster.shutdown()
