"""Measures an emulated parameter server's link: run inside the cluster's namespace, it
listens on the server's port and streams bytes through it, one direction after the
other, and prints `{"to_server_mb_s": .., "from_server_mb_s": ..}` (MB = 10^6 bytes).

    ip netns exec NAMESPACE python -m omnikeras.emulation.link_probe --port PORT
"""

import argparse
import json
import socket
import threading
import time

_CHUNK = 1 << 20


def measure(port: int, megabytes: float, timeout: float = 120.0) -> dict[str, float]:
    """MB/s of a stream to 127.0.0.1:`port` and of one back from it."""
    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(timeout)
    total = int(megabytes * 1e6)
    rates: dict[str, float] = {}

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(timeout)
            rates["to_server_mb_s"] = _receive(connection, total)
            _send(connection, total)

    server = threading.Thread(target=serve)
    server.start()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as client:
        _send(client, total)
        rates["from_server_mb_s"] = _receive(client, total)
    server.join(timeout)
    listener.close()
    return rates


def _send(connection: socket.socket, total: int) -> None:
    chunk = bytes(_CHUNK)
    sent = 0
    while sent < total:
        sent += connection.send(chunk[: min(_CHUNK, total - sent)])


def _receive(connection: socket.socket, total: int) -> float:
    """MB/s from the first byte received to the last."""
    received = len(connection.recv(_CHUNK))
    started = time.perf_counter()
    first = received
    while received < total:
        data = connection.recv(_CHUNK)
        if not data:
            raise ConnectionError(f"the stream ended after {received} of {total} bytes")
        received += len(data)
    return (received - first) / 1e6 / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--megabytes", type=float, default=50.0)
    args = parser.parse_args()
    print(json.dumps(measure(args.port, args.megabytes)), flush=True)


if __name__ == "__main__":
    main()
