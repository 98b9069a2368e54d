"""Wall time to a target test accuracy: OmnivoreCallback against the settings and tools
users would run instead, on this host and on an emulated cluster.

Each run is the main job's CNN (`examples/fashion_mnist.py`) on Fashion-MNIST, batch 64,
5 planned epochs; the time is from the start of `fit` until the chief's check of the
accuracy on the first 2,000 test images (every 5 s) first finds 88%. A run that does not
reach it within the limit counts as the limit (the ratio is then a bound, and the output
says so). On this host, one after the other:

* `plain_sgd_s`: plain Keras in one process, SGD(0.01, momentum 0.9);
* `plain_adam_s`: plain Keras, Adam with Keras' defaults;
* `sync_s`: `omnikeras launch --workers 4 --groups 1` with SGD(0.01, 0.9) (the launcher
  merges the 4 workers into one process here: the fastest synchronous layout);
* `async_s`: 4 worker processes in 4 groups, SGD(0.01, 0.9);
* `omnivore_s`: `omnikeras launch --workers 1` with OmnivoreCallback (target loss 0.3),
  tuning time included: one process is the fastest layout on one CPU machine, so the
  tuner tunes momentum and learning rate;
* `omnivore_over_best_host`: `omnivore_s` over the best of `plain_sgd_s` and `sync_s`
  (goal: at most 1.15).

On the emulated cluster `cpu-cluster-1gbit` (8 hosts of a quarter core, the parameter
server behind 1 Gbit/s; needs root), 10 planned epochs, with the paper's low end for the
fixed settings:

* `emulated_sync_s`: 1 group, SGD(0.01, 0.9); `emulated_async_s`: 8 groups, SGD(0.01,
  0.9); `emulated_omnivore_s`: OmnivoreCallback choosing groups, momentum and learning
  rate;
* `emulated_best_fixed_over_omnivore`: the best of the two fixed runs over the tuned one
  (goal: at least 1.9).

The last line of stdout is one JSON object with these keys. `--quick` runs the same on
digits (95% accuracy) and on two emulated hosts of half a core, for a correctness check.
The logs and the tuner's studies stay in `--log-dir`.

    .venv/bin/python benchmarks/time_to_accuracy.py [--quick]
"""

import argparse
import datetime
import json
import pathlib
import re
import subprocess
import sys

from omnikeras.emulation import ClusterSpec, missing_requirements

WORKER_SCRIPT = pathlib.Path(__file__).with_name("time_to_accuracy_worker.py")
QUICK_SPEC = {"link": "1gbit", "hosts": [{"name": "half", "cpus": 0.5, "count": 2}]}
_RESULT = re.compile(r"^(NOT )?REACHED ([\d.]+) accuracy ([\d.na]+)", re.MULTILINE)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(label: str, command: list[str]) -> tuple[float, bool]:
    log(f"{label}: {' '.join(command[1:])}")
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True)
    for line in result.stdout.splitlines():
        if line.startswith("omnivore"):
            log(f"  {line}")
    match = _RESULT.search(result.stdout)
    if match is None:
        raise RuntimeError(f"{label} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    reached, seconds = match.group(1) is None, float(match.group(2))
    log(f"{label}: {'reached' if reached else 'did NOT reach'} the target in {seconds:.1f} s (accuracy {match.group(3)})")
    return seconds, reached


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="digits and two emulated hosts, a few minutes")
    parser.add_argument("--log-dir", type=pathlib.Path, help="default: runs/time-to-accuracy-<time>")
    args = parser.parse_args()
    log_dir = args.log_dir or pathlib.Path(f"runs/time-to-accuracy-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    # A fresh directory: servers started on old checkpoints would resume from them.
    log_dir.mkdir(parents=True, exist_ok=False)
    worker = str(WORKER_SCRIPT)
    if args.quick:
        common = ["--dataset", "digits", "--target-accuracy", "0.95", "--max-seconds", "60", "--batch-size", "32",
                  "--epochs", "20", "--check-every", "1"]
        target_loss, spec_arg = "0.15", str(log_dir / "two-halves-1gbit.json")
        pathlib.Path(spec_arg).write_text(json.dumps(QUICK_SPEC))
    else:
        common = ["--dataset", "fashion_mnist", "--target-accuracy", "0.88", "--max-seconds", "600", "--check-every", "5"]
        target_loss, spec_arg = "0.3", "cpu-cluster-1gbit"
    hosts = len(ClusterSpec.load(spec_arg).hosts)

    def launch(label: str, *options: str, tuned: bool = False, epochs: tuple[str, ...] = ()) -> tuple[float, bool]:
        tuning = ["--omnivore-target-loss", target_loss, "--storage", f"sqlite:///{log_dir}/{label}.db"] if tuned else []
        return run(label, ["-m", "omnikeras", "launch", "--log-dir", str(log_dir / label), *options, worker, *common, *epochs, *tuning])

    results: dict[str, tuple[float, bool]] = {
        "plain_sgd_s": run("plain_sgd", [worker, *common, "--plain"]),
        "plain_adam_s": run("plain_adam", [worker, *common, "--plain", "--adam"]),
        "sync_s": launch("sync", "--workers", "4", "--groups", "1"),
        "async_s": launch("async", "--workers", "4", "--groups", "4", "--no-merge"),
        "omnivore_s": launch("omnivore", "--workers", "1", tuned=True),
    }
    missing = missing_requirements(ClusterSpec.load(spec_arg))
    if missing:
        log(f"no emulated cluster here ({'; '.join(missing)}): its figures are left out")
    else:
        # Every emulated run plans more epochs than any of them needs, as users plan
        # training: the 5 of the host runs end about when 8 groups reach the target.
        longer = () if args.quick else ("--epochs", "10")
        results |= {
            "emulated_sync_s": launch("emulated_sync", "--emulate", spec_arg, "--groups", "1", epochs=longer),
            "emulated_async_s": launch("emulated_async", "--emulate", spec_arg, "--groups", str(hosts), epochs=longer),
            "emulated_omnivore_s": launch(
                "emulated_omnivore", "--emulate", spec_arg, "--groups", str(hosts), tuned=True, epochs=longer
            ),
        }
    log(f"logs and the tuner's studies in {log_dir}")
    figures: dict[str, float] = {key: round(seconds, 1) for key, (seconds, _) in results.items()}
    best_host = min(("plain_sgd_s", "sync_s"), key=lambda key: results[key][0])
    figures["omnivore_over_best_host"] = round(results["omnivore_s"][0] / results[best_host][0], 3)
    _say_bound("omnivore_over_best_host", results, "omnivore_s", (best_host,))
    if not missing:
        best_fixed = min(("emulated_sync_s", "emulated_async_s"), key=lambda key: results[key][0])
        figures["emulated_best_fixed_over_omnivore"] = round(results[best_fixed][0] / results["emulated_omnivore_s"][0], 2)
        _say_bound("emulated_best_fixed_over_omnivore", results, "emulated_omnivore_s", ("emulated_sync_s", "emulated_async_s"))
    print(json.dumps(figures))
    return 0


def _say_bound(figure: str, results: dict[str, tuple[float, bool]], tuned: str, fixed: tuple[str, ...]) -> None:
    if not results[tuned][1]:
        log(f"{figure}: the tuned run did not reach the target, so the figure is a bound in the baselines' favour")
    elif not all(results[key][1] for key in fixed):
        log(f"{figure}: a baseline did not reach the target, so the figure is a bound in the tuner's disfavour")


if __name__ == "__main__":
    sys.exit(main())
