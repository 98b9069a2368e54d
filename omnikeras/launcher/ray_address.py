"""Which Ray cluster `launch(ray=...)` joins, and whether anything answers there: found out
before Ray is imported, since Ray reads how to treat loopback addresses as it is imported.

A cluster started on loopback (`ray.cluster_utils.Cluster`, or `ray start --head
--node-ip-address 127.0.0.1`) listens on 127.0.0.1 alone. On Linux, Ray turns the loopback
address it is given into this machine's routable address, unless
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` was set when it was imported, and then waits for a
GCS that is not there: 20 tries of about 36 s, each logging "Failed to get cluster ID from
GCS server: TimedOut". So a loopback address stays on loopback (`prepare`), and every
address is tried with a plain TCP connection first (`check_answers`), so that a cluster
that is not there is reported in seconds, with what to check. `resolve` does all of it.
"""

import ipaddress
import os
import pathlib
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass

# Written by Ray where it starts a cluster on this machine, removed when it stops cleanly;
# `ray.init(address="auto")` joins the cluster it names.
CURRENT_CLUSTER = pathlib.Path("/tmp/ray/ray_current_cluster")
# Read by Ray as it is imported: "0" keeps this node, and the loopback addresses it is
# given, on 127.0.0.1.
LOOPBACK_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# How long a cluster's address may take to accept a TCP connection.
PROBE_SECONDS = 5.0


@dataclass(frozen=True)
class ClusterAddress:
    """The address of a Ray cluster to join, and where the launcher found it.

    Args:
        address: `host:port` of the cluster's head (its GCS), a Ray Client address
            `ray://host:port`, or `auto` (Ray looks for a cluster on this machine).
        source: Where it came from, for messages: `--ray-address`, `RAY_ADDRESS`, or the
            file Ray writes where it starts a cluster.

    Example:

    >>> ClusterAddress("127.0.0.1:6379", "--ray-address").on_loopback
    True
    """

    address: str
    source: str

    @property
    def host_and_port(self) -> tuple[str, int] | None:
        """Where a TCP connection reaches the cluster; None for `auto` or an address
        that does not name one.

        >>> ClusterAddress("ray://[::1]:10001", "RAY_ADDRESS").host_and_port
        ('::1', 10001)
        """
        host, _, port = self.address.removeprefix("ray://").rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit():
            return None
        return host, int(port)

    @property
    def on_loopback(self) -> bool:
        """Whether the address is on this machine's loopback (127.0.0.0/8, ::1, localhost)."""
        target = self.host_and_port
        if target is None:
            return False
        if target[0] == "localhost":
            return True
        try:
            return ipaddress.ip_address(target[0]).is_loopback
        except ValueError:
            return False


def cluster_to_join(address: str | None) -> ClusterAddress | None:
    """The cluster to join: `address` (None or `auto`: the one `RAY_ADDRESS` names, else
    the one Ray last started on this machine, in `CURRENT_CLUSTER`); None where there is
    none, or `address` is `local`: the launcher starts one.

    >>> cluster_to_join("10.0.0.1:6379")
    ClusterAddress(address='10.0.0.1:6379', source='--ray-address')
    """
    if address == "local":
        return None
    if address and address != "auto":
        return ClusterAddress(address, "--ray-address")
    from_environment = os.environ.get("RAY_ADDRESS", "")
    if from_environment == "local":
        return None
    if from_environment and from_environment != "auto":
        return ClusterAddress(from_environment, "RAY_ADDRESS")
    try:
        last_started = CURRENT_CLUSTER.read_text().strip()
    except OSError:
        last_started = ""
    if last_started:
        return ClusterAddress(last_started, str(CURRENT_CLUSTER))
    if address == "auto" or from_environment == "auto":
        # Ray looks for a cluster's processes on this machine itself.
        return ClusterAddress("auto", "--ray-address" if address == "auto" else "RAY_ADDRESS")
    return None


def prepare(cluster: ClusterAddress | None) -> None:
    """Sets what Ray reads as it is imported: a cluster started here, or joined on
    loopback, has its nodes on 127.0.0.1, and this process must see them there too. A
    value the user set wins; nothing changes once Ray is imported."""
    if cluster is None or cluster.on_loopback:
        os.environ.setdefault(LOOPBACK_VARIABLE, "0")
    if cluster is None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def answers(cluster: ClusterAddress, timeout: float = PROBE_SECONDS) -> bool:
    """Whether something accepts a TCP connection at the cluster's address within
    `timeout` seconds (True where the address names no host and port, as `auto`)."""
    try:
        check_answers(cluster, timeout)
    except ConnectionError:
        return False
    return True


def check_answers(cluster: ClusterAddress, timeout: float = PROBE_SECONDS) -> None:
    """Raises ConnectionError, naming the address, where it came from and what to check,
    unless something accepts a TCP connection there within `timeout` seconds."""
    target = cluster.host_and_port
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout):
            pass
    except OSError as error:
        reason = f"no answer within {timeout:g} s" if isinstance(error, TimeoutError) else error.strerror or str(error)
        where = "" if cluster.source == "--ray-address" else f" (from {cluster.source})"
        raise ConnectionError(
            f"no Ray cluster answers at {cluster.address}{where}: {reason}. Check that the "
            f"cluster is up (`ray status --address {cluster.address}`), that this is its head's address, host:port "
            "as `ray start --head` printed it (port 6379 unless chosen) or as `Cluster.address` gives it, and that "
            "this machine can reach that port"
        ) from None


def resolve(address: str | None, say: Callable[[str], None]) -> str | None:
    """The address the launcher gives `ray.init`, the cluster checked to answer and Ray's
    environment prepared; None: start a cluster here (also where the cluster Ray last
    started on this machine is gone, which `say` tells), or use the one this process is
    connected to already. Raises ConnectionError where a cluster asked for does not
    answer.
    """
    imported = sys.modules.get("ray")
    if imported is not None and imported.is_initialized():
        return None
    cluster = cluster_to_join(address)
    if cluster is not None and cluster.source == str(CURRENT_CLUSTER) and not answers(cluster):
        say(f"the Ray cluster last started on this machine ({cluster.address}) does not answer: starting one")
        cluster = None
    if imported is None:
        prepare(cluster)
    elif cluster is not None and cluster.on_loopback and os.environ.get(LOOPBACK_VARIABLE) != "0":
        say(
            f"Ray was imported before {LOOPBACK_VARIABLE}=0 was set: it may seek {cluster.address} at this "
            "machine's network address, where a cluster on loopback does not listen"
        )
    if cluster is None:
        return None
    check_answers(cluster)
    return cluster.address
