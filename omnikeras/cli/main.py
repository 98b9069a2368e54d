"""Entry point of the `omnikeras` command."""

import argparse
import sys

from omnikeras.cli import launch, profile, ps, report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="omnikeras", description="The Omnivore optimizer for Keras.")
    subparsers = parser.add_subparsers(required=True, metavar="COMMAND")
    ps.add_parser(subparsers)
    launch.add_parser(subparsers)
    profile.add_parser(subparsers)
    report.add_parser(subparsers)
    args = parser.parse_args(argv)
    sys.exit(args.run(args))
