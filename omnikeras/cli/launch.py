"""`omnikeras launch`: a training script on a local cluster."""

import argparse
import sys

from omnikeras.launcher import launch
from omnikeras.launcher.launcher import LaunchError


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "launch",
        help="run a training script on a local or Ray cluster",
        description="Starts parameter servers and worker processes of SCRIPT on this machine, or on a Ray cluster.",
    )
    parser.add_argument("--workers", type=int, help="worker processes (default: 4, or the emulated cluster's)")
    parser.add_argument("--groups", type=int, default=1, help="compute groups (default: %(default)s)")
    parser.add_argument("--ps-shards", type=int, default=1, help="parameter-server processes (default: %(default)s)")
    parser.add_argument(
        "--throughputs",
        type=_floats,
        help="examples/s of each worker, comma-separated: sizes each one's share of its group's batch",
    )
    parser.add_argument(
        "--profile",
        help="JSON profile of this host (from `omnikeras profile`): sizes the batch shares, sets the thread settings",
    )
    parser.add_argument(
        "--no-merge", dest="merge", action="store_false",
        help="on a CPU host, start one process per worker instead of one per group with the group's merged batch",
    )
    parser.add_argument(
        "--no-shared-memory", dest="shared_memory", action="store_false",
        help="send gradients and weights over gRPC, as to servers on another host, not through shared memory",
    )
    parser.add_argument(
        "--emulate",
        metavar="SPEC",
        help="run on an emulated cluster (needs root): a built-in spec (cpu-cluster-1gbit, mixed) "
        "or a JSON/YAML spec file of hosts, CPU caps, link bandwidth and faults",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND:TARGET@AT[+SECONDS]",
        help="inject a fault into the emulated cluster, AT seconds after training begins (every worker joined): "
        "pause:HOST@AT+SECONDS, kill-worker:HOST@AT, kill-ps:SHARD@AT, cut-link:SHARD@AT+SECONDS (repeatable)",
    )
    parser.add_argument(
        "--ray",
        action="store_true",
        help="run on this machine's Ray cluster, or on a new one on its loopback (pip install 'omnikeras[ray]'): "
        "one worker per GPU and one per CPU node (--workers: fewer, or more sharing the CPU nodes' CPUs)",
    )
    parser.add_argument(
        "--ray-address", metavar="ADDRESS",
        help="run on the Ray cluster whose head is at ADDRESS, host:port (implies --ray)",
    )
    parser.add_argument("--group-timeout", type=float, default=60.0, help="seconds a group waits for a missing member (default: %(default)s)")
    parser.add_argument(
        "--checkpoint-every", type=float, default=30.0,
        help="seconds between the servers' checkpoints, from which a restarted server resumes (default: %(default)s)",
    )
    parser.add_argument(
        "--measure-momentum", action="store_true",
        help="the servers measure the total momentum of their updates (tens of microseconds per update)",
    )
    parser.add_argument(
        "--no-compensation", dest="compensate_asynchrony", action="store_false",
        help="apply the compiled momentum and learning rate as they are with several groups, instead of "
        "compensating the momentum and step that asynchrony changes",
    )
    parser.add_argument("--token", help="shared secret between servers and workers (on Ray, a random one by default)")
    parser.add_argument("--tls-cert", help="PEM certificate the parameter servers serve TLS with (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--tls-ca", help="PEM certificate of the CA the workers trust (default: --tls-cert, self-signed)")
    parser.add_argument("--log-dir", help="where the logs go (default: runs/launch-<time>)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shared data shuffle (default: %(default)s)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments of the script")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        return launch(
            args.script,
            args.script_args,
            workers=args.workers,
            groups=args.groups,
            ps_shards=args.ps_shards,
            throughputs=args.throughputs,
            group_timeout=args.group_timeout,
            checkpoint_every=args.checkpoint_every,
            measure_momentum=args.measure_momentum,
            compensate_asynchrony=args.compensate_asynchrony,
            token=args.token,
            log_dir=args.log_dir,
            seed=args.seed,
            profile=args.profile,
            merge=args.merge,
            shared_memory=args.shared_memory,
            emulate=args.emulate,
            faults=args.fault,
            ray=args.ray_address or args.ray,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_ca=args.tls_ca,
        )
    except (ValueError, OSError, LaunchError, RuntimeError) as error:
        print(f"omnikeras launch: {error}", file=sys.stderr)
        return 2


def _floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
