"""`omnikeras report`: an HTML report and PNG figures of the study an OmnivoreCallback left."""

import argparse
import sys


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "report",
        help="write an HTML report of an Omnivore study",
        description="Writes DIR/index.html and its PNG figures for the Optuna study in STORAGE.",
    )
    parser.add_argument("storage", metavar="STORAGE", help="an RDB URL (sqlite:///runs/omnivore.db) or a journal file's path")
    parser.add_argument("--study", help="the study's name (default: the storage's only study, else omnivore)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write the report into")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Imported here, not above: matplotlib and Optuna would slow the start of every other
    # command, `omnikeras ps` included.
    import matplotlib

    matplotlib.use("Agg")
    import optuna

    from omnikeras.report import ReportError, load_study, write_report

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = load_study(args.storage, args.study)
    except ReportError as error:
        print(f"omnikeras report: {error}", file=sys.stderr)
        return 2
    print(write_report(study, args.out))
    return 0
