"""Wall time to a target test accuracy: OmnivoreCallback against the settings and tools
users would run instead, on this host and on an emulated cluster.

Each run is the main job's CNN (`examples/fashion_mnist.py`) on Fashion-MNIST, batch 64,
5 planned epochs; the time is from the start of `fit` until the weights first reach 88%
accuracy on the first 2,000 test images. The chief checks every 2 s on this host, every
5 s on the emulated cluster, and keeps a copy of the weights every 0.25 s in between: the
time is that of the first copy that reaches the target, evaluated after training, or of
the check that found it. A run that does not
reach it within the limit counts as the limit (the ratio is then a bound, and the output
says so). On this host, one after the other:

* `plain_sgd_s`: plain Keras in one process, SGD(0.01, momentum 0.9);
* `plain_adam_s`: plain Keras, Adam with Keras' defaults;
* `omnikeras_adam_s`: `omnikeras launch --workers 1` with Adam's defaults (its moments on
  the parameter server), and `omnikeras_adam_over_plain_adam`, its time over
  `plain_adam_s` (goal: at most 1.15);
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
  the target over the synchronous run's (goal: at most 1.5);
* with Adam's defaults in place of SGD: `emulated_adam_sync_s` (1 group),
  `emulated_adam_async_s` (8 groups, compensated: the default), `emulated_adam_omnivore_s`
  (OmnivoreCallback tuning Adam's learning rate, `beta_1` and the groups), and
  `emulated_adam_default_over_omnivore`, the best of the first two over the tuned run
  (full runs only: `--quick` leaves them out).

`--oracle` runs the oracle sweep on `--spec` instead: fixed configurations, g in {1, 2, 4,
8} groups times learning rates {0.01, 0.03} times momenta {0.6, 0.9}, compensation off and
on where g > 1, each once and each limited to the best time so far (a slower run cannot
be the best: it stops at that limit), then the best configuration twice more (its median
of 3 counts), then the tuned run `--repeats` times:

* `emulated_omnivore_over_oracle`: `emulated_omnivore_s` over the oracle's best (goal: at
  most 1.15).

The sweep is kept in `benchmarks/oracle/<spec>.json` with its commit; full runs read it and
print `emulated_omnivore_over_oracle` beside their other figures, until the model or the
cluster changes and the sweep is run again.

Each figure is the median of `--repeats` runs (the runs of one setting follow each other;
single runs move by tens of seconds on a shared machine). The last line of stdout is one
JSON object with these keys. `--quick` runs the same on digits (95% accuracy) and on two
emulated hosts of half a core, once each, for a correctness check; `--emulated-only`
leaves this host's runs out, `--host-only` the emulated cluster's, and `--optimizer sgd`
(or `adam`) the other optimizer's runs and figures. The logs and the tuner's studies stay in `--log-dir`.

    .venv/bin/python benchmarks/time_to_accuracy.py [--quick] [--repeats 3] [--spec mixed --emulated-only | --host-only] [--optimizer adam]
    .venv/bin/python benchmarks/time_to_accuracy.py --oracle [--spec mixed]
"""

import argparse
import dataclasses
import datetime
import json
import pathlib
import re
import subprocess
import sys
from collections.abc import Callable

from omnikeras.emulation import ClusterSpec, missing_requirements

WORKER_SCRIPT = pathlib.Path(__file__).with_name("time_to_accuracy_worker.py")
QUICK_SPEC = {"link": "1gbit", "hosts": [{"name": "half", "cpus": 0.5, "count": 2}]}
EMULATED_MAX_SECONDS = 1200
ORACLE_DIR = pathlib.Path(__file__).with_name("oracle")
ORACLE_GROUPS = (8, 4, 2, 1)
ORACLE_LEARNING_RATES = (0.01, 0.03)
ORACLE_MOMENTA = (0.9, 0.6)
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
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--emulated-only", action="store_true", help="leave this host's runs out")
    where.add_argument("--host-only", action="store_true", help="leave the emulated cluster's runs out")
    parser.add_argument(
        "--optimizer", choices=("sgd", "adam"), help="only the runs with this optimizer and their figures (default: both)"
    )
    parser.add_argument("--oracle", action="store_true", help="the oracle sweep on --spec and the tuned run beside it")
    args = parser.parse_args()
    sgd, adam = args.optimizer in (None, "sgd"), args.optimizer in (None, "adam")
    repeats = args.repeats or (1 if args.quick else 3)
    log_dir = args.log_dir or pathlib.Path(f"runs/time-to-accuracy-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    # A fresh directory: servers started on old checkpoints would resume from them.
    log_dir.mkdir(parents=True, exist_ok=False)
    worker = str(WORKER_SCRIPT)
    if args.oracle and args.quick:
        parser.error("--oracle sweeps the full run's model and cluster; it has no --quick form")
    if args.oracle and args.optimizer == "adam":
        parser.error("--oracle sweeps SGD's learning rates and momenta; it has no --optimizer adam form")
    if args.quick:
        common = ["--dataset", "digits", "--target-accuracy", "0.95", "--max-seconds", "60", "--batch-size", "32",
                  "--epochs", "20", "--check-every", "1"]
        target_loss, spec_arg = "0.15", str(log_dir / "two-halves-1gbit.json")
        pathlib.Path(spec_arg).write_text(json.dumps(QUICK_SPEC))
        emulated: tuple[str, ...] = ()
    else:
        common = ["--dataset", "fashion_mnist", "--target-accuracy", "0.88", "--max-seconds", "600", "--check-every", "2"]
        target_loss, spec_arg = "0.3", args.spec
        # Every emulated run plans more epochs, and gets more time, than any of them needs,
        # as users plan training: the baselines must reach the target for a ratio to count.
        # Their times run to minutes: a check every 5 s costs them less and tells as much.
        emulated = ("--epochs", "20", "--max-seconds", str(EMULATED_MAX_SECONDS), "--check-every", "5")
    hosts = len(ClusterSpec.load(spec_arg).hosts)

    def launch(
        label: str, *options: str, tuned: bool = False, extra: tuple[str, ...] = (), repeats: int = repeats
    ) -> Outcome:
        tuning = ["--omnivore-target-loss", target_loss, "--storage", f"sqlite:///{log_dir}/{label}.db"] if tuned else []
        command = ["-m", "omnikeras", "launch", "--log-dir", str(log_dir / label), *options, worker, *common, *extra, *tuning]
        return median_of(label, command, repeats)

    if args.oracle:
        missing = missing_requirements(ClusterSpec.load(spec_arg))
        if missing:
            parser.error(f"the oracle sweep needs the emulated cluster: {'; '.join(missing)}")
        return oracle_sweep(spec_arg, repeats, launch, emulated)

    results: dict[str, Outcome] = {}
    if not args.emulated_only and sgd:
        results |= {
            "plain_sgd_s": median_of("plain_sgd", [worker, *common, "--plain"], repeats),
            "sync_s": launch("sync", "--workers", "4", "--groups", "1"),
            "async_s": launch("async", "--workers", "4", "--groups", "4", "--no-merge"),
            "omnivore_s": launch("omnivore", "--workers", "1", tuned=True),
        }
    if not args.emulated_only and adam:
        results |= {
            "plain_adam_s": median_of("plain_adam", [worker, *common, "--plain", "--adam"], repeats),
            "omnikeras_adam_s": launch("omnikeras_adam", "--workers", "1", extra=("--adam",)),
        }
    missing = ["left out by --host-only"] if args.host_only else missing_requirements(ClusterSpec.load(spec_arg))
    if missing:
        log(f"no emulated cluster runs ({'; '.join(missing)}): their figures are left out")
    on_cluster = ("--emulate", spec_arg)
    if not missing and sgd:
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
    if not missing and adam and not args.quick:
        with_adam = (*emulated, "--adam")
        results |= {
            "emulated_adam_sync_s": launch("emulated_adam_sync", *on_cluster, "--groups", "1", extra=with_adam),
            "emulated_adam_async_s": launch("emulated_adam_async", *on_cluster, "--groups", str(hosts), extra=with_adam),
            "emulated_adam_omnivore_s": launch(
                "emulated_adam_omnivore", *on_cluster, "--groups", str(hosts), tuned=True, extra=with_adam
            ),
        }
    log(f"logs and the tuner's studies in {log_dir}")
    figures: dict[str, float] = {key: round(outcome.seconds, 1) for key, outcome in results.items()}
    if "omnivore_s" in results:
        best_host = min(("plain_sgd_s", "sync_s"), key=lambda key: results[key].seconds)
        figures["omnivore_over_best_host"] = round(results["omnivore_s"].seconds / results[best_host].seconds, 3)
        _say_bound("omnivore_over_best_host", results, "omnivore_s", (best_host,))
    if "omnikeras_adam_s" in results:
        figures["omnikeras_adam_over_plain_adam"] = round(results["omnikeras_adam_s"].seconds / results["plain_adam_s"].seconds, 3)
    if "emulated_omnivore_s" in results:
        default = min(("emulated_sync_s", "emulated_async_s"), key=lambda key: results[key].seconds)
        figures["emulated_default_over_omnivore"] = round(
            results[default].seconds / results["emulated_omnivore_s"].seconds, 2
        )
        _say_bound("emulated_default_over_omnivore", results, "emulated_omnivore_s", ("emulated_sync_s", "emulated_async_s"))
        oracle_file = ORACLE_DIR / f"{ClusterSpec.load(spec_arg).name}.json"
        if not args.quick and oracle_file.exists():
            oracle = json.loads(oracle_file.read_text())
            log(f"the oracle: {oracle['best']} in {oracle['best_s']} s, swept at commit {oracle['commit']}")
            figures["emulated_omnivore_over_oracle"] = round(results["emulated_omnivore_s"].seconds / oracle["best_s"], 3)
        sync, compensated = results["emulated_sync_s"], results["emulated_compensated_s"]
        figures["emulated_compensated_over_sync_updates"] = round(compensated.updates / sync.updates, 2)
        if not (sync.reached and compensated.reached):
            log("emulated_compensated_over_sync_updates: a run did not reach the target, so the figure counts its updates until it stopped")
    if "emulated_adam_omnivore_s" in results:
        adam_default = min(("emulated_adam_sync_s", "emulated_adam_async_s"), key=lambda key: results[key].seconds)
        figures["emulated_adam_default_over_omnivore"] = round(
            results[adam_default].seconds / results["emulated_adam_omnivore_s"].seconds, 2
        )
        _say_bound(
            "emulated_adam_default_over_omnivore", results, "emulated_adam_omnivore_s",
            ("emulated_adam_sync_s", "emulated_adam_async_s"),
        )
    print(json.dumps(figures))
    return 0


def oracle_sweep(spec_arg: str, repeats: int, launch: Callable[..., Outcome], emulated: tuple[str, ...]) -> int:
    """Every fixed configuration of the grid once, each limited to the best time so far, the
    best one to a median of 3, then the tuned run; writes the sweep to `ORACLE_DIR`."""
    spec = ClusterSpec.load(spec_arg)
    hosts = len(spec.hosts)
    grid = [
        (groups, rate, momentum, compensated)
        for compensated in (True, False)
        for groups in ORACLE_GROUPS
        if groups <= hosts and (compensated or groups > 1)
        for rate in ORACLE_LEARNING_RATES
        for momentum in ORACLE_MOMENTA
    ]
    best_s, best = float("inf"), None
    sweep = []
    for groups, rate, momentum, compensated in grid:
        name = f"{groups} groups, SGD({rate}, {momentum}), compensation {'on' if compensated else 'off'}"
        if groups == 1:
            name = f"1 group, SGD({rate}, {momentum})"  # nothing to compensate
        options = ("--emulate", spec_arg, "--groups", str(groups), *(() if compensated else ("--no-compensation",)))
        extra = (*emulated, "--learning-rate", str(rate), "--momentum", str(momentum))
        limit = min(best_s, EMULATED_MAX_SECONDS)
        label = f"oracle-{groups}g-{rate}-{momentum}-{'on' if compensated else 'off'}"
        outcome = launch(label, *options, extra=(*extra, "--max-seconds", f"{limit:.1f}"), repeats=1)
        sweep.append({"configuration": name, "seconds": round(outcome.seconds, 1), "reached": outcome.reached,
                      "limit_s": round(limit, 1)})
        if outcome.reached and outcome.seconds < best_s:
            best_s, best = outcome.seconds, (name, options, extra, label)
    if best is None:
        raise RuntimeError("no configuration of the oracle's grid reached the target")
    name, options, extra, label = best
    again = [launch(f"{label}-again{k}", *options, extra=extra, repeats=1) for k in range(2)]
    best_runs_s = sorted([best_s, *(outcome.seconds for outcome in again)])
    best_s = best_runs_s[1]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ORACLE_DIR.parent
    ).stdout.strip()
    ORACLE_DIR.mkdir(exist_ok=True)
    oracle_file = ORACLE_DIR / f"{spec.name}.json"
    oracle_file.write_text(json.dumps(
        {"spec": spec.name, "commit": commit, "best": name, "best_s": round(best_s, 1),
         "best_runs_s": [round(seconds, 1) for seconds in best_runs_s], "sweep": sweep}, indent=1
    ) + "\n")
    log(f"the oracle: {name}, median {best_s:.1f} s; the sweep in {oracle_file}")
    tuned = launch("emulated_omnivore", "--emulate", spec_arg, "--groups", str(hosts), tuned=True, extra=emulated, repeats=repeats)
    figures = {
        "oracle_s": round(best_s, 1),
        "emulated_omnivore_s": round(tuned.seconds, 1),
        "emulated_omnivore_over_oracle": round(tuned.seconds / best_s, 3),
    }
    if not tuned.reached:
        log("emulated_omnivore_over_oracle: the tuned run did not reach the target, so the figure is a bound")
    print(json.dumps(figures))
    return 0


def _say_bound(figure: str, results: dict[str, Outcome], tuned: str, fixed: tuple[str, ...]) -> None:
    if not results[tuned].reached:
        log(f"{figure}: the tuned run did not reach the target, so the figure is a bound in the baselines' favour")
    elif not all(results[key].reached for key in fixed):
        log(f"{figure}: a baseline did not reach the target, so the figure is a bound in the tuner's disfavour")


if __name__ == "__main__":
    sys.exit(main())
