"""`omnikeras ps`: runs one parameter-server process until it is stopped."""

import argparse
import logging
import os
import signal
import sys
import threading

from omnikeras import tf_config
from omnikeras.parameter_server import Hyperparameters, ParameterServer, allocator
from omnikeras.processes import SERVER_READY


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser("ps", help="run a parameter server")
    parser.add_argument(
        "--host", help="address to listen on (default: 127.0.0.1, or 0.0.0.0 for a ps task of $TF_CONFIG)"
    )
    parser.add_argument(
        "--port", type=int, help="0 picks a free port (default: 50051, or the port of a ps task of $TF_CONFIG)"
    )
    parser.add_argument("--groups", type=int, default=1, help="number of compute groups (default: %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=0.01, help="until a worker initialises the model (default: %(default)s)")
    parser.add_argument("--momentum", type=float, default=0.0, help="until a worker initialises the model (default: %(default)s)")
    parser.add_argument("--nesterov", action="store_true")
    parser.add_argument("--group-timeout", type=float, default=60.0, help="seconds a group step waits for a member before dropping it (default: %(default)s)")
    parser.add_argument("--checkpoint-dir", help="write checkpoints here, and resume from the newest one")
    parser.add_argument("--checkpoint-every", type=float, help="seconds between automatic checkpoints")
    parser.add_argument(
        "--token",
        default=os.environ.get("OMNIKERAS_TOKEN"),
        help="shared secret every call must carry (default: $OMNIKERAS_TOKEN)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        help="serve the grpc.health.v1 service also on this port, without the token (for orchestrators)",
    )
    parser.add_argument("--tls-cert", help="PEM certificate to serve TLS with")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--measure-momentum", action="store_true",
        help="measure the total momentum of the updates (GetStats' total_momentum; tens of microseconds per update)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s ps %(levelname)s %(message)s")
    # This process is the server's alone: its allocator may keep what each step frees.
    allocator.keep_freed_memory()
    try:
        host, port = _address(args)
        server = ParameterServer(
            host=host,
            port=port,
            num_groups=args.groups,
            hyperparameters=Hyperparameters(
                args.learning_rate, args.momentum, settings={"nesterov": 1.0} if args.nesterov else {}
            ),
            group_timeout=args.group_timeout,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_every=args.checkpoint_every,
            token=args.token,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            health_port=args.health_port,
            measure_momentum=args.measure_momentum,
        )
    except ValueError as error:
        print(f"omnikeras ps: {error}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    # Launchers and tests read this line to learn the port when --port is 0.
    print(f"{SERVER_READY}{server.address}", flush=True)
    stop.wait()
    server.stop()
    return 0


def _address(args: argparse.Namespace) -> tuple[str, int]:
    """Where to listen: as given, else as a ps task of `TF_CONFIG` (on every interface:
    the workers are on other machines), else on this machine's loopback."""
    task = tf_config.parameter_server_from_env() if args.host is None or args.port is None else None
    if task is not None:
        return args.host or "0.0.0.0", args.port if args.port is not None else task.server_port()
    return args.host or "127.0.0.1", args.port if args.port is not None else 50051
