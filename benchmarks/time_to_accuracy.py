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

On the emulated cluster `--spec` (`cpu-cluster-1gbit` by default: 8 hosts of a quarter
core, the parameter server behind 1 Gbit/s; `mixed`: one host of a whole core among 4 of
a quarter, whose groups race unequally; needs root), 20 planned epochs and 1,200 s at
most, so that the baselines reach the target, with one group per host where asynchronous:

* `emulated_sync_s`: 1 group, SGD(0.01, 0.9); `emulated_async_s`: 8 groups, SGD(0.01,
  0.9) with compensation off (`--no-compensation`: the settings users start with);
  `emulated_compensated_s`: 8 groups, SGD(0.01, 0.9) compensated (the default);
  `emulated_omnivore_s`: OmnivoreCallback choosing groups, momentum and learning rate;
* `emulated_default_over_omnivore`: the best of `emulated_sync_s` and `emulated_async_s`
  over `emulated_omnivore_s`, tuning included (goal: at least 1.9);
* `emulated_compensated_over_sync_updates`: the updates the compensated 8 groups took to
  the target over the synchronous run's (goal: at most 1.5).

Each figure is the median of `--repeats` runs (the runs of one setting follow each other;
single runs move by tens of seconds on a shared machine). The last line of stdout is one
JSON object with these keys. `--quick` runs the same on digits (95% accuracy) and on two
emulated hosts of half a core, once each, for a correctness check; `--emulated-only`
leaves this host's runs out. The logs and the tuner's studies stay in `--log-dir`.

    .venv/bin/python benchmarks/time_to_accuracy.py [--quick] [--repeats 3] [--spec mixed --emulated-only]
"""

import argparse
import dataclasses
import datetime
import json
import pathlib
import re
import subprocess
import sys

from omnikeras.emulation import ClusterSpec, missing_requirements

WORKER_SCRIPT = pathlib.Path(__file__).with_name("time_to_accuracy_worker.py")
QUICK_SPEC = {"link": "1gbit", "hosts": [{"name": "half", "cpus": 0.5, "count": 2}]}
_RESULT = re.compile(r"^(NOT )?REACHED ([\d.]+) accuracy ([\d.na]+) updates (\d+)", re.MULTILINE)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Outcome:
    seconds: float
    reached: bool
    updates: int


def run(label: str, command: list[str]) -> Outcome:
    log(f"{label}: {' '.join(command[1:])}")
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True)
    for line in result.stdout.splitlines():
        if line.startswith("omnivore"):
            log(f"  {line}")
    match = _RESULT.search(result.stdout)
    if match is None:
        raise RuntimeError(f"{label} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    outcome = Outcome(float(match.group(2)), match.group(1) is None, int(match.group(4)))
    log(
        f"{label}: {'reached' if outcome.reached else 'did NOT reach'} the target in {outcome.seconds:.1f} s, "
        f"{outcome.updates} updates (accuracy {match.group(3)})"
    )
    return outcome


def median_of(label: str, command: list[str], repeats: int) -> Outcome:
    """The run of median time among `repeats` runs of `command`, each in its own log directory."""
    outcomes = sorted(
        (run(f"{label}#{k}" if repeats > 1 else label, _in_own_dir(command, k, repeats)) for k in range(repeats)),
        key=lambda outcome: outcome.seconds,
    )
    return outcomes[len(outcomes) // 2]


def _in_own_dir(command: list[str], k: int, repeats: int) -> list[str]:
    """`command` with its `--log-dir` and sqlite storage suffixed by the repeat: a server
    would resume from an earlier run's checkpoints."""
    if repeats == 1:
        return command
    return [
        f"{part}-{k}" if previous == "--log-dir" else part.replace(".db", f"-{k}.db") if part.startswith("sqlite:") else part
        for previous, part in zip(["", *command], command)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="digits and two emulated hosts, a few minutes")
    parser.add_argument("--repeats", type=int, help="runs of each setting, whose median counts (default: 3, 1 with --quick)")
    parser.add_argument("--log-dir", type=pathlib.Path, help="default: runs/time-to-accuracy-<time>")
    parser.add_argument("--spec", default="cpu-cluster-1gbit", help="the emulated cluster (default: %(default)s)")
    parser.add_argument("--emulated-only", action="store_true", help="leave this host's runs out")
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    log_dir = args.log_dir or pathlib.Path(f"runs/time-to-accuracy-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    # A fresh directory: servers started on old checkpoints would resume from them.
    log_dir.mkdir(parents=True, exist_ok=False)
    worker = str(WORKER_SCRIPT)
    if args.quick:
        common = ["--dataset", "digits", "--target-accuracy", "0.95", "--max-seconds", "60", "--batch-size", "32",
                  "--epochs", "20", "--check-every", "1"]
        target_loss, spec_arg = "0.15", str(log_dir / "two-halves-1gbit.json")
        pathlib.Path(spec_arg).write_text(json.dumps(QUICK_SPEC))
        emulated = ()
    else:
        common = ["--dataset", "fashion_mnist", "--target-accuracy", "0.88", "--max-seconds", "600", "--check-every", "5"]
        target_loss, spec_arg = "0.3", args.spec
        # Every emulated run plans more epochs, and gets more time, than any of them needs,
        # as users plan training: the baselines must reach the target for a ratio to count.
        emulated = ("--epochs", "20", "--max-seconds", "1200")
    hosts = len(ClusterSpec.load(spec_arg).hosts)

    def launch(label: str, *options: str, tuned: bool = False, extra: tuple[str, ...] = ()) -> Outcome:
        tuning = ["--omnivore-target-loss", target_loss, "--storage", f"sqlite:///{log_dir}/{label}.db"] if tuned else []
        command = ["-m", "omnikeras", "launch", "--log-dir", str(log_dir / label), *options, worker, *common, *extra, *tuning]
        return median_of(label, command, repeats)

    results: dict[str, Outcome] = {}
    if not args.emulated_only:
        results |= {
            "plain_sgd_s": median_of("plain_sgd", [worker, *common, "--plain"], repeats),
            "plain_adam_s": median_of("plain_adam", [worker, *common, "--plain", "--adam"], repeats),
            "sync_s": launch("sync", "--workers", "4", "--groups", "1"),
            "async_s": launch("async", "--workers", "4", "--groups", "4", "--no-merge"),
            "omnivore_s": launch("omnivore", "--workers", "1", tuned=True),
        }
    missing = missing_requirements(ClusterSpec.load(spec_arg))
    if missing:
        log(f"no emulated cluster here ({'; '.join(missing)}): its figures are left out")
    else:
        on_cluster = ("--emulate", spec_arg)
        results |= {
            "emulated_sync_s": launch("emulated_sync", *on_cluster, "--groups", "1", extra=emulated),
            "emulated_async_s": launch(
                "emulated_async", *on_cluster, "--groups", str(hosts), "--no-compensation", extra=emulated
            ),
            "emulated_compensated_s": launch("emulated_compensated", *on_cluster, "--groups", str(hosts), extra=emulated),
            "emulated_omnivore_s": launch(
                "emulated_omnivore", *on_cluster, "--groups", str(hosts), tuned=True, extra=emulated
            ),
        }
    log(f"logs and the tuner's studies in {log_dir}")
    figures: dict[str, float] = {key: round(outcome.seconds, 1) for key, outcome in results.items()}
    if not args.emulated_only:
        best_host = min(("plain_sgd_s", "sync_s"), key=lambda key: results[key].seconds)
        figures["omnivore_over_best_host"] = round(results["omnivore_s"].seconds / results[best_host].seconds, 3)
        _say_bound("omnivore_over_best_host", results, "omnivore_s", (best_host,))
    if not missing:
        default = min(("emulated_sync_s", "emulated_async_s"), key=lambda key: results[key].seconds)
        figures["emulated_default_over_omnivore"] = round(
            results[default].seconds / results["emulated_omnivore_s"].seconds, 2
        )
        _say_bound("emulated_default_over_omnivore", results, "emulated_omnivore_s", ("emulated_sync_s", "emulated_async_s"))
        sync, compensated = results["emulated_sync_s"], results["emulated_compensated_s"]
        figures["emulated_compensated_over_sync_updates"] = round(compensated.updates / sync.updates, 2)
        if not (sync.reached and compensated.reached):
            log("emulated_compensated_over_sync_updates: a run did not reach the target, so the figure counts its updates until it stopped")
    print(json.dumps(figures))
    return 0


def _say_bound(figure: str, results: dict[str, Outcome], tuned: str, fixed: tuple[str, ...]) -> None:
    if not results[tuned].reached:
        log(f"{figure}: the tuned run did not reach the target, so the figure is a bound in the baselines' favour")
    elif not all(results[key].reached for key in fixed):
        log(f"{figure}: a baseline did not reach the target, so the figure is a bound in the tuner's disfavour")


if __name__ == "__main__":
    sys.exit(main())
