"""`omnikeras profile`: measures this machine's devices for a model, writes a JSON profile."""

import argparse
import sys

from omnikeras.profiles.model_spec import REFERENCE
from omnikeras.profiles.profile import ClusterProfile
from omnikeras.profiles.profiler import DEFAULT_BATCH_SIZES, profile_devices


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "profile",
        help="measure this machine's devices for a model",
        description=(
            "Measures each local device's training throughput for a model over a range of batch "
            "sizes, the CPU thread settings that serve it best, and the parameter server's "
            "push_pull time for its size; writes a JSON profile for `omnikeras launch --profile`."
        ),
    )
    parser.add_argument(
        "--model", default=REFERENCE,
        help="MODULE:FUNCTION or path/file.py:FUNCTION returning a Keras model (default: a reference CNN on 28x28x1)",
    )
    parser.add_argument("--devices", type=_devices, help="devices to measure, comma-separated, like cpu,gpu:0 (default: all)")
    parser.add_argument(
        "--batch-sizes", type=_integers, default=list(DEFAULT_BATCH_SIZES),
        help="batch sizes to measure, comma-separated (default: %(default)s)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement; the median is kept (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=1.0, help="about how long each timed run lasts (default: %(default)s)")
    parser.add_argument("--out", default="omnikeras-profile.json", help="the JSON profile to write (default: %(default)s)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.seconds <= 0 or min(args.batch_sizes) < 1:
        print("omnikeras profile: --repeats, --seconds and the batch sizes must be positive", file=sys.stderr)
        return 2
    try:
        profile = profile_devices(args.model, args.devices, args.batch_sizes, args.repeats, args.seconds)
    except (ValueError, RuntimeError) as error:
        print(f"omnikeras profile: {error}", file=sys.stderr)
        return 1
    profile.save(args.out)
    print(format_table(profile))
    print(f"profile written to {args.out}")
    return 0


def format_table(profile: ClusterProfile) -> str:
    """The profile as a text table: one row per device, examples/s per batch size.

    >>> print(format_table(profile))
    reference_cnn: 1,199,882 parameters, push_pull 4.1 ms
    device   threads    batch 16   batch 64
    /CPU:0   2/1             910       1480
    """
    batch_sizes = sorted({b for device in profile.devices for b in device.batch_sizes})
    header = ["device", "threads", *(f"batch {b}" for b in batch_sizes)]
    rows = [header]
    for device in profile.devices:
        threads = f"{device.intra_op_threads}/{device.inter_op_threads}" if device.intra_op_threads else "default"
        measured = dict(zip(device.batch_sizes, device.examples_per_second))
        rows.append([device.name, threads, *(f"{measured[b]:.0f}" if b in measured else "-" for b in batch_sizes)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        f"{profile.model}: {profile.parameter_count:,} parameters, "
        f"push_pull {profile.push_pull_seconds * 1e3:.1f} ms; examples/s by batch size, "
        "threads intra/inter-op"
    ]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def _devices(text: str) -> list[str]:
    names = []
    for part in text.split(","):
        kind, _, index = part.strip().strip("/").upper().partition(":")
        if kind not in ("CPU", "GPU") or not (index or "0").isdigit():
            raise argparse.ArgumentTypeError(f"expected devices like cpu,gpu:0, got {part!r}")
        names.append(f"/{kind}:{index or 0}")
    return names


def _integers(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
