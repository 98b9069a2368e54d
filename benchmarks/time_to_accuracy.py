"""Wall time to a target test accuracy: fixed settings against OmnivoreCallback.

Three runs of the same model, data, batch and target on a local cluster of 4 workers,
one after the other in this run:

* `sync_s`: synchronous (g = 1), momentum 0.9, learning rate 0.01 (on a CPU host the
  launcher merges the 4 workers into one process, the fastest synchronous layout);
* `async_s`: fully asynchronous (g = 4), momentum 0.9, learning rate 0.01;
* `omnivore_s`: OmnivoreCallback choosing groups, momentum and learning rate, tuning
  time included.

Each is the time from the start of `fit` until the chief's check of the accuracy on the
first 2,000 test images (every few seconds) first finds the target; a run that does not reach it within the time
limit counts as the limit (the ratio is then a bound, and the output says so). The last
line of stdout is one JSON object:
`{"sync_s": .., "async_s": .., "omnivore_s": .., "best_baseline_over_omnivore": ..}`.

    .venv/bin/python benchmarks/time_to_accuracy.py           # Fashion-MNIST, CNN
    .venv/bin/python benchmarks/time_to_accuracy.py --quick   # digits, a few minutes

The logs of every run and the tuner's study stay in `--log-dir`.
"""

import argparse
import datetime
import json
import pathlib
import re
import subprocess
import sys

WORKER_SCRIPT = pathlib.Path(__file__).with_name("time_to_accuracy_worker.py")
WORKERS = 4


def run(label: str, groups: int, script_args: list[str], log_dir: pathlib.Path) -> tuple[float, bool]:
    command = [
        sys.executable, "-m", "omnikeras", "launch", "--workers", str(WORKERS), "--groups", str(groups),
        "--log-dir", str(log_dir / label), str(WORKER_SCRIPT), *script_args,
    ]
    print(f"{label}: {' '.join(command[3:])}", file=sys.stderr, flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    for line in result.stdout.splitlines():
        if line.startswith("omnivore"):
            print(f"  {line}", file=sys.stderr, flush=True)
    match = re.search(r"^(NOT )?REACHED ([\d.]+) accuracy ([\d.]+)", result.stdout, re.MULTILINE)
    if result.returncode != 0 or match is None:
        raise RuntimeError(f"{label} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    reached, seconds = match.group(1) is None, float(match.group(2))
    print(f"{label}: {'reached' if reached else 'did NOT reach'} the target in {seconds:.1f} s "
          f"(accuracy {match.group(3)})", file=sys.stderr, flush=True)
    return seconds, reached


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="digits, a few minutes")
    parser.add_argument("--log-dir", type=pathlib.Path, help="default: runs/time-to-accuracy-<time>")
    args = parser.parse_args()
    log_dir = args.log_dir or pathlib.Path(f"runs/time-to-accuracy-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    if args.quick:
        common = ["--dataset", "digits", "--target-accuracy", "0.95", "--max-seconds", "90", "--batch-size", "32"]
        target_loss = "0.15"
    else:
        common = ["--dataset", "fashion_mnist", "--target-accuracy", "0.88", "--max-seconds", "900", "--check-every", "5"]
        target_loss = "0.3"
    # A fresh directory: servers started on old checkpoints would resume from them.
    log_dir.mkdir(parents=True, exist_ok=False)
    study = log_dir / "study.db"
    sync_s, sync_ok = run("sync", 1, common, log_dir)
    async_s, async_ok = run("async", WORKERS, common, log_dir)
    omnivore_args = [*common, "--omnivore-target-loss", target_loss, "--storage", f"sqlite:///{study}"]
    # One process per worker, so that the tuner can choose any number of groups.
    omnivore_s, omnivore_ok = run("omnivore", WORKERS, omnivore_args, log_dir)
    print(f"logs and the tuner's study in {log_dir}: omnikeras report sqlite:///{study} --out {log_dir}/report",
          file=sys.stderr)
    best = min(sync_s, async_s)
    ratio = best / omnivore_s
    if not omnivore_ok:
        print("OmnivoreCallback did not reach the target: the ratio is an upper bound", file=sys.stderr)
    elif not (sync_ok and async_ok):
        print("a baseline did not reach the target: the ratio is a lower bound", file=sys.stderr)
    print(json.dumps({
        "sync_s": round(sync_s, 1),
        "async_s": round(async_s, 1),
        "omnivore_s": round(omnivore_s, 1),
        "best_baseline_over_omnivore": round(ratio, 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
