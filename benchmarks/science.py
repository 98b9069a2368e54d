"""Does omnikeras' method do what the Omnivore paper and "Asynchrony begets momentum" say?

Four experiments, on the main job's CNN on Fashion-MNIST and a small MLP on digits, each
through the real parts (`omnikeras launch --emulate cpu-cluster-1gbit`: a parameter server
and a worker process on each of 8 emulated hosts of a quarter core, which take turns as the
papers' groups do):

1. Implicit momentum: with explicit momentum 0, the total momentum the parameter server
   measures from its updates (`total_momentum` in its stats) against 1 - 1/g, for g
   groups of the 8 workers.
2. The best explicit momentum falls as g rises: the loss after a fixed number of updates
   (on a fixed batch of training data, from the same first weights) over explicit momenta
   -0.3, 0, 0.3, 0.6, 0.9 at every g and the model's first learning rate, 3 seeds, with
   compensation off; and with it on, over the compiled momenta 0, 0.3, 0.6, 0.9 that
   compensation steers the total towards (the best should then stay where g = 1 has it).
3. Tuned asynchrony costs little per update: at each g, the updates to a target loss of
   the best momentum and learning rate (compensated or not) against the best synchronous
   (g = 1) one's.
4. The hardware model predicts: seconds per update on the emulated cluster
   `cpu-cluster-1gbit`, predicted for the most groups (8) by `MeasuredHardwareModel` from
   the measured fewer (1, 2 and 4), against measured.

It writes the results, with plots, into `docs/science.md` (between its results markers;
the method and the discussion around them are kept) and the PNGs next to it. The last
line of stdout is one JSON object: `{"implicit_momentum_max_error": ..,
"best_momentum_non_increasing": true|false, "compensated_over_uncompensated_loss": ..,
"tuned_async_over_sync_updates": .., "he_prediction_error": ..}` (the worst g of each). `--quick`: digits only, 4 workers, fewer updates, one seed,
an emulated cluster of 4 hosts of half a core; a check that it runs, in a few minutes. The
emulated cluster needs root; without it the trials run as processes on this host (where
groups do not take turns evenly) and the fourth experiment is left out (null).

`--optimizer adam` runs experiments 1 and 2 with Adam, its `beta_1` (a moving average of the
gradients) in place of the explicit momentum: 0, 0.3, 0.6, 0.9 and 0.95, compiled 0.3 to
0.95 with compensation, at one learning rate a model. Its results go between their own
markers on the page, so that each optimizer's run keeps the other's; experiments 3 and 4
stay SGD's (null), and the JSON line's keys start with `adam_`.

    .venv/bin/python benchmarks/science.py [--quick] [--optimizer sgd|adam] [--out DIR]
"""

import argparse
import dataclasses
import json
import math
import pathlib
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import emulated_cluster

from omnikeras.convergence import MeasuredHardwareModel, implicit_momentum
from omnikeras.emulation import ClusterSpec, missing_requirements

WORKER_SCRIPT = pathlib.Path(__file__).with_name("science_worker.py")
MOMENTA = (-0.3, 0.0, 0.3, 0.6, 0.9)
COMPENSATED_MOMENTA = (0.0, 0.3, 0.6, 0.9)
START, END = "<!-- science results: start -->", "<!-- science results: end -->"
# Adam's beta_1 averages the gradients: below 0 it means nothing (compensation never goes
# there), and 0.95 is as common as its default 0.9.
ADAM_BETAS = (0.0, 0.3, 0.6, 0.9, 0.95)
# Compiled 0 is left out: compensation cannot lower it, so it would repeat the uncompensated
# trial under the step cap.
ADAM_COMPENSATED_BETAS = (0.3, 0.6, 0.9, 0.95)
ADAM_START, ADAM_END = "<!-- science adam results: start -->", "<!-- science adam results: end -->"


@dataclasses.dataclass(frozen=True)
class Setup:
    """One model's experiment: its dataset, workers (as many as the emulated cluster's
    hosts), numbers of groups, updates per trial, learning rates (the first for
    experiments 1 and 2), seeds and experiment 3's target loss (well above where the best
    synchronous trials end, so that asynchronous ones taking more updates reach it too)."""

    dataset: str
    title: str
    workers: int
    groups: tuple[int, ...]
    updates: int
    learning_rates: tuple[float, ...]
    seeds: tuple[int, ...]
    target_loss: float


FULL = (
    Setup("digits", "MLP on digits", 8, (1, 2, 4, 8), 150, (0.3, 0.1, 1.0), (0, 1, 2), 0.1),
    Setup("fashion_mnist", "main CNN on Fashion-MNIST", 8, (1, 2, 4, 8), 150, (0.05, 0.015, 0.15), (0, 1, 2), 0.7),
)
QUICK = (Setup("digits", "MLP on digits", 4, (1, 2, 4), 60, (0.3,), (0,), 0.2),)
QUICK_CLUSTER_FIELDS = {"link": "1gbit", "hosts": [{"name": "half", "cpus": 0.5, "count": 4}]}
# Adam's rates: where its synchronous loss after a trial's updates comes near SGD's at the
# setup's first rate and best momentum, so that both optimizers' asynchronous losses start
# from the same level. Plain Keras, one process, 150 updates of 64, seed 0: on digits 0.083
# and 0.095 at Adam(0.01) with beta_1 0 and 0.9 against 0.079 at SGD(0.3, 0.9) (Keras'
# default 0.001: 0.59, a trial too short for it); on the CNN 0.55 and 0.56 at Keras'
# default Adam(0.001) against 0.57 at SGD(0.05, 0.9). One rate each: only experiment 3
# tunes it.
ADAM_FULL = (
    Setup("digits", "MLP on digits", 8, (1, 2, 4, 8), 150, (0.01,), (0, 1, 2), 0.1),
    Setup("fashion_mnist", "main CNN on Fashion-MNIST", 8, (1, 2, 4, 8), 150, (0.001,), (0, 1, 2), 0.7),
)
ADAM_QUICK = (Setup("digits", "MLP on digits", 4, (1, 2, 4), 60, (0.01,), (0,), 0.2),)


@dataclasses.dataclass(frozen=True)
class Study:
    """The study of one optimizer: the worker's `--optimizer`, its name on the page, its
    momentum-like setting, the values of it experiment 2 tries (compiled ones with
    compensation, among the former: the synchronous row takes them from those), its
    setups, the experiments it runs, the markers of its results on the page, and what its
    figures' keys and plots' files start with."""

    optimizer: str
    title: str
    setting: str
    momenta: tuple[float, ...]
    compensated_momenta: tuple[float, ...]
    full: tuple[Setup, ...]
    quick: tuple[Setup, ...]
    experiments: tuple[int, ...]
    markers: tuple[str, str]
    prefix: str

    @property
    def heading(self) -> str:
        """What the headings of its results start with: nothing for SGD's, the page's first."""
        return f"{self.title}: " if self.prefix else ""


SGD = Study("sgd", "SGD", "momentum", MOMENTA, COMPENSATED_MOMENTA, FULL, QUICK, (1, 2, 3, 4), (START, END), "")
# Experiment 3 tunes the learning rate and momentum over three rates, a study of its own for
# each optimizer; experiment 4's seconds per update are the hardware's, whatever the rule.
ADAM = Study(
    "adam", "Adam", "beta_1", ADAM_BETAS, ADAM_COMPENSATED_BETAS, ADAM_FULL, ADAM_QUICK, (1, 2), (ADAM_START, ADAM_END),
    "adam_",
)
STUDIES = {study.optimizer: study for study in (SGD, ADAM)}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# Running ---------------------------------------------------------------------------------


def cluster_options(setup: Setup, emulated: str | None) -> list[str]:
    """`omnikeras launch`'s options for the setup's workers: one per host of the emulated
    cluster `emulated` (a spec's name or file), or processes on this host."""
    if emulated is None:
        return ["--workers", str(setup.workers), "--no-merge"]
    return ["--emulate", emulated]


def run_seed(study: Study, setup: Setup, seed: int, work: pathlib.Path, emulated: str | None) -> list[dict]:
    """One launch: every (groups, learning rate, momentum) trial of one seed."""
    command = [
        sys.executable, "-m", "omnikeras", "launch", *cluster_options(setup, emulated), "--groups", "1",
        # The trials set the explicit momentum themselves, as the papers' experiments do.
        "--measure-momentum", "--no-compensation",
        "--log-dir", str(work / f"{study.optimizer}-{setup.dataset}-seed-{seed}"), str(WORKER_SCRIPT),
        "--dataset", setup.dataset, "--seed", str(seed), "--optimizer", study.optimizer,
        "--groups", ",".join(map(str, setup.groups)),
        f"--momenta={','.join(map(str, study.momenta))}", "--updates", str(setup.updates),
        "--learning-rates", ",".join(map(str, setup.learning_rates)),
        "--compensated-momenta", ",".join(map(str, study.compensated_momenta)), "--target-loss", str(setup.target_loss),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=3 * 3600)
    trials = [json.loads(line.removeprefix("TRIAL ")) for line in run.stdout.splitlines() if line.startswith("TRIAL ")]
    planned = len(setup.groups) * len(setup.learning_rates) * len(study.momenta) + sum(
        len(study.compensated_momenta) for g in setup.groups if g > 1
    )
    if run.returncode != 0 or len(trials) != planned:
        raise RuntimeError(f"{setup.dataset}, seed {seed}: the launch failed\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    for trial in trials:
        loss = trial["loss"]
        log(
            f"  {setup.dataset} seed {seed}, {trial['groups']} groups, learning rate {trial['learning_rate']}, "
            f"{study.setting} {_setting(trial['momentum'])}{' compensated' if trial['compensated'] else ''}: "
            f"loss {loss if loss is None else round(loss, 4)} after {trial['updates']} updates, "
            f"updates to {setup.target_loss}: {trial['updates_to_target']}, "
            f"total momentum measured {_rounded(trial['total_momentum'])}, mean staleness {_rounded(trial['mean_staleness'])}, "
            f"updates by group {trial['updates_by_group']}"
        )
    return trials


def emulated_spec(quick: bool, work: pathlib.Path) -> str | None:
    """The emulated cluster's spec (a name or a file) for the study, or None where this
    machine cannot emulate."""
    spec_arg = "cpu-cluster-1gbit"
    if quick:
        spec_arg = str(work / "four-halves-1gbit.json")
        pathlib.Path(spec_arg).write_text(json.dumps(QUICK_CLUSTER_FIELDS))
    missing = missing_requirements(ClusterSpec.load(spec_arg))
    if missing:
        log(f"this machine cannot emulate a cluster ({'; '.join(missing)}): trials run as processes on this host, "
            "the hardware model is left out")
        return None
    return spec_arg


def measure_hardware(quick: bool, spec_arg: str, work: pathlib.Path) -> dict[int, float]:
    """Seconds per update on the emulated cluster at every number of groups."""
    spec = ClusterSpec.load(spec_arg)
    warmup, seconds = (2.0, 4.0) if quick else (10.0, 20.0)
    hosts = len(spec.hosts)
    measured = {}
    for groups in [g for g in range(1, hosts + 1) if hosts % g == 0]:
        result = emulated_cluster.seconds_per_update(spec, spec_arg, groups, warmup, seconds, str(work))
        measured[groups] = result["seconds_per_update"]
        log(f"  {spec.name}, {groups} groups: {measured[groups] * 1e3:.0f} ms per update")
    return measured


# Analysis (plain functions of the trials) --------------------------------------------------


def compensated(trials: Sequence[dict], on: bool) -> list[dict]:
    """The trials with compensation on, or off."""
    return [t for t in trials if t["compensated"] == on]


def losses_by_setting(trials: Sequence[dict]) -> dict[tuple[int, float], list[float]]:
    """Each (groups, momentum)'s losses over the seeds; a diverged trial's is inf."""
    by: dict[tuple[int, float], list[float]] = {}
    for trial in trials:
        loss = trial["loss"]
        by.setdefault((trial["groups"], trial["momentum"]), []).append(math.inf if loss is None else loss)
    return by


def mean_loss(losses: Sequence[float]) -> float:
    return statistics.fmean(losses) if all(math.isfinite(x) for x in losses) else math.inf


def best_momenta(trials: Sequence[dict]) -> dict[int, float]:
    """At each number of groups, the explicit momentum of the lowest mean loss."""
    by = losses_by_setting(trials)
    best: dict[int, float] = {}
    for groups in sorted({g for g, _ in by}):
        candidates = {m: mean_loss(losses) for (g, m), losses in by.items() if g == groups}
        best[groups] = min(candidates, key=lambda m: (candidates[m], m))
    return best


def non_increasing(values: Sequence[float]) -> bool:
    """
    >>> non_increasing([0.9, 0.6, 0.6, 0.0]), non_increasing([0.6, 0.9])
    (True, False)
    """
    return all(later <= earlier for earlier, later in zip(values, values[1:]))


def measured_total_momentum(trials: Sequence[dict], groups: int, momentum: float) -> float:
    """The server's measured total momentum of a setting, over the seeds; NaN if none."""
    values = [t["total_momentum"] for t in trials if t["groups"] == groups and t["momentum"] == momentum]
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else math.nan


def implicit_momentum_errors(trials: Sequence[dict]) -> dict[int, float]:
    """|measured total momentum - (1 - 1/g)| at explicit momentum 0, by groups."""
    groups = sorted({t["groups"] for t in trials})
    return {g: abs(measured_total_momentum(trials, g, 0.0) - implicit_momentum(g)) for g in groups}


def at_rate(trials: Sequence[dict], learning_rate: float) -> list[dict]:
    return [t for t in trials if t["learning_rate"] == learning_rate]


def uncompensated_at_first_rate(results: dict[Setup, list[dict]]) -> dict[Setup, list[dict]]:
    """Experiments 1 and 2's trials: compensation off, each setup's first learning rate."""
    return {setup: at_rate(compensated(trials, False), setup.learning_rates[0]) for setup, trials in results.items()}


def best_losses(trials: Sequence[dict]) -> dict[int, float]:
    """At each number of groups, the lowest mean loss over the momenta."""
    by = losses_by_setting(trials)
    return {g: mean_loss(by[(g, m)]) for g, m in best_momenta(trials).items()}


def compensated_over_uncompensated(trials: Sequence[dict]) -> dict[int, float]:
    """At each number of groups that ran both, the best mean loss with compensation over
    the best without (the trials of one learning rate)."""
    on, off = best_losses(compensated(trials, True)), best_losses(compensated(trials, False))
    return {g: on[g] / off[g] for g in sorted(on) if g in off}


@dataclasses.dataclass(frozen=True)
class Tuned:
    """The best setting of a number of groups for experiment 3: the fewest mean updates to
    the target loss over the seeds (a setting where a seed did not reach it counts by the
    trials' updates, as a bound)."""

    learning_rate: float
    momentum: float
    compensated: bool
    updates: float
    reached: bool


def best_tuned(trials: Sequence[dict]) -> dict[int, Tuned]:
    """At each number of groups, the setting (learning rate, momentum, compensated or not)
    of the fewest mean updates to the target loss; among settings that did not reach it,
    the lowest mean loss."""
    by: dict[tuple[int, float, float, bool], list[dict]] = {}
    for trial in trials:
        by.setdefault((trial["groups"], trial["learning_rate"], trial["momentum"], trial["compensated"]), []).append(trial)
    best: dict[int, tuple[tuple[float, float], Tuned]] = {}
    for (groups, rate, momentum, on), runs in sorted(by.items()):
        reached = all(t["updates_to_target"] is not None for t in runs)
        updates = statistics.fmean(t["updates_to_target"] if reached else t["updates"] for t in runs)
        rank = (updates, 0.0) if reached else (math.inf, mean_loss([math.inf if t["loss"] is None else t["loss"] for t in runs]))
        if groups not in best or rank < best[groups][0]:
            best[groups] = (rank, Tuned(rate, momentum, on, updates, reached))
    return {g: tuned for g, (_, tuned) in best.items()}


def tuned_over_sync(trials: Sequence[dict]) -> dict[int, float]:
    """Each number of groups' fewest mean updates to the target over the synchronous (g =
    1) fewest: a lower bound where the asynchronous setting did not reach the target."""
    best = best_tuned(trials)
    return {g: best[g].updates / best[1].updates for g in sorted(best) if g > 1}


def he_errors(measured: dict[int, float]) -> dict[int, tuple[float, float]]:
    """For the most groups measured: (its seconds per update predicted from all the fewer
    ones, the prediction's relative error)."""
    *known, most = sorted(measured)
    model = MeasuredHardwareModel(num_workers=most)
    for groups in known:
        model.observe(groups, measured[groups])
    predicted = model.seconds_per_update(most)
    return {most: (predicted, abs(predicted - measured[most]) / measured[most])}


def figures_of(study: Study, results: dict[Setup, list[dict]], measured: dict[int, float] | None) -> dict:
    """The JSON line's figures, the worst g of each, under the study's keys: those of the
    experiments it does not run null, as is the hardware model's where none was measured."""
    base = uncompensated_at_first_rate(results)
    implicit_errors = [e for trials in base.values() for e in implicit_momentum_errors(trials).values()]
    best = [best_momenta(trials) for trials in base.values()]
    figures = {
        "implicit_momentum_max_error": round(max(implicit_errors), 3) if all(map(math.isfinite, implicit_errors)) else None,
        "best_momentum_non_increasing": all(non_increasing([b[g] for g in sorted(b)]) for b in best),
        "compensated_over_uncompensated_loss": round(max(
            r for setup, trials in results.items()
            for r in compensated_over_uncompensated(at_rate(trials, setup.learning_rates[0])).values()
        ), 3),
        "tuned_async_over_sync_updates": None,
        "he_prediction_error": None,
    }
    if 3 in study.experiments:
        figures["tuned_async_over_sync_updates"] = round(
            max(r for trials in results.values() for r in tuned_over_sync(trials).values()), 3
        )
    if measured:
        figures["he_prediction_error"] = round(max(e for _, e in he_errors(measured).values()), 3)
    return {study.prefix + key: value for key, value in figures.items()}


def _listed(values: Sequence[float]) -> str:
    return ", ".join(map(str, values))


def _rounded(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _setting(value: float) -> str:
    """A momentum-like setting as the page shows it: one decimal, or two where it has them.

    >>> _setting(0.0), _setting(-0.3), _setting(0.95)
    ('+0.0', '-0.3', '+0.95')
    """
    return f"{value:+.1f}" if round(value, 1) == value else f"{value:+.2f}"


# Plots and the page ------------------------------------------------------------------------


def plot_implicit(study: Study, results: dict[Setup, list[dict]], path: pathlib.Path) -> None:
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5.5, 4))
    all_groups = sorted({g for s in results for g in s.groups})
    axis.plot(all_groups, [implicit_momentum(g) for g in all_groups], "k--", label="1 - 1/g")
    for setup, trials in results.items():
        means, spreads = [], []
        for g in setup.groups:
            values = [t["total_momentum"] for t in trials if t["groups"] == g and t["momentum"] == 0.0 and t["total_momentum"] is not None]
            means.append(statistics.fmean(values) if values else math.nan)
            spreads.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        axis.errorbar(setup.groups, means, yerr=spreads, marker="o", capsize=3, label=f"measured, {setup.title}")
    _over_groups(axis, all_groups, f"total momentum at explicit {study.setting} 0")
    axis.set_title(f"Asynchrony's implicit momentum, {study.title}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_grid(study: Study, results: dict[Setup, list[dict]], path: pathlib.Path) -> None:
    import matplotlib.pyplot as plt

    momenta, compiled = study.momenta, study.compensated_momenta
    figure, axes = plt.subplots(2, len(results), figsize=(5.5 * len(results), 7.5), squeeze=False)
    for column, (setup, all_trials) in enumerate(results.items()):
        trials = compensated(all_trials, False)
        by, on = losses_by_setting(trials), losses_by_setting(compensated(all_trials, True))
        axis = axes[0][column]
        for g in setup.groups:
            means = [mean_loss(by[(g, m)]) for m in momenta]
            errors = [statistics.stdev(by[(g, m)]) if len(by[(g, m)]) > 1 and math.isfinite(means[i]) else 0.0 for i, m in enumerate(momenta)]
            shown = [x if math.isfinite(x) else math.nan for x in means]
            line = axis.errorbar(momenta, shown, yerr=errors, marker="o", capsize=3, label=f"{g} group{'s' * (g > 1)}")
            if (g, compiled[0]) in on:
                compensated_means = [mean_loss(on[(g, m)]) for m in compiled]
                axis.plot(
                    compiled, [x if math.isfinite(x) else math.nan for x in compensated_means], "--",
                    marker="s", color=line[0].get_color(), label=f"{g} groups, compensated (compiled {study.setting})",
                )
        axis.set_xlabel(f"explicit {study.setting} (compensated: the compiled {study.setting})")
        axis.set_ylabel(f"loss after {setup.updates} updates")
        axis.set_title(f"{setup.title}, {study.title}")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
        best = best_momenta(trials)
        axis = axes[1][column]
        groups = list(setup.groups)
        axis.plot(groups, [best[g] for g in groups], marker="o", label=f"best explicit {study.setting}")
        axis.plot(groups, [best[g] + implicit_momentum(g) for g in groups], marker="s", label="best explicit + (1 - 1/g)")
        axis.plot(groups, [measured_total_momentum(trials, g, best[g]) for g in groups], marker="^", label="total measured at the best")
        _over_groups(axis, groups, "momentum")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _over_groups(axis: Any, groups: Sequence[int], ylabel: str) -> None:
    """The x axis of a plot over the numbers of groups, doubling at each tick."""
    axis.set_xscale("log", base=2)
    axis.set_xticks(groups, [str(g) for g in groups])
    axis.set_xlabel("groups")
    axis.set_ylabel(ylabel)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)


def plot_hardware(measured: dict[int, float], errors: dict[int, tuple[float, float]], path: pathlib.Path) -> None:
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5.5, 4))
    groups = sorted(measured)
    axis.plot(groups, [measured[g] for g in groups], marker="o", label="measured")
    known = [g for g in groups if g not in errors]
    axis.plot(known, [measured[g] for g in known], "s", markersize=10, fillstyle="none", label="the model's input")
    axis.plot(list(errors), [p for p, _ in errors.values()], "x", markersize=10, label=f"predicted from g = {_listed(known)}")
    axis.set_yscale("log")
    _over_groups(axis, groups, "seconds per update")
    axis.set_title("Hardware efficiency, emulated cluster")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def results_markdown(
    study: Study, results: dict[Setup, list[dict]], measured: dict[int, float] | None, figures: dict, where: str
) -> str:
    """The study's results section: `results` holds every trial of each setup, run `where`."""
    base = uncompensated_at_first_rate(results)
    start, end = study.markers
    heading, setting, plot = study.heading, study.setting, f"science_{study.prefix}"
    lines = [start, "", f"Every trial ran {where}.", "", f"### {heading}Implicit momentum (experiment 1)", "",
             "| model | g | 1 - 1/g | total momentum measured (mean over seeds) | from the staleness |",
             "|---|---|---|---|---|"]
    for setup, trials in base.items():
        for g in setup.groups:
            zero = [t for t in trials if t["groups"] == g and t["momentum"] == 0.0]
            staleness = [t["mean_staleness"] for t in zero if t["mean_staleness"] is not None]
            from_staleness = statistics.fmean(staleness) / (1 + statistics.fmean(staleness)) if staleness else math.nan
            lines.append(f"| {setup.title} | {g} | {implicit_momentum(g):.3f} | {_rounded(measured_total_momentum(trials, g, 0.0))} | {_rounded(from_staleness)} |")
    lines += ["", f"![Implicit momentum]({plot}implicit_momentum.png)", "",
              f"### {heading}Loss over explicit {setting} (experiment 2)", ""]
    for setup, trials in base.items():
        by = losses_by_setting(trials)
        best = best_momenta(trials)
        lines += [f"{setup.title}: loss after {setup.updates} updates, learning rate {setup.learning_rates[0]}, "
                  f"{len(setup.seeds)} seed{'s' * (len(setup.seeds) > 1)} (mean ± standard deviation; inf: diverged)", "",
                  "| g | " + " | ".join(map(_setting, study.momenta)) + " | best | total measured at the best |",
                  "|---|" + "---|" * (len(study.momenta) + 2)]
        for g in setup.groups:
            cells = []
            for m in study.momenta:
                losses = by[(g, m)]
                mean = mean_loss(losses)
                spread = statistics.stdev(losses) if len(losses) > 1 and math.isfinite(mean) else 0.0
                cells.append(f"{mean:.4f} ± {spread:.4f}" if math.isfinite(mean) else "inf")
            lines.append(f"| {g} | " + " | ".join(cells) + f" | {_setting(best[g])} | {_rounded(measured_total_momentum(trials, g, best[g]))} |")
        lines.append("")
    for setup, trials in results.items():
        on, off = losses_by_setting(compensated(trials, True)), losses_by_setting(base[setup])
        ratios = compensated_over_uncompensated(at_rate(trials, setup.learning_rates[0]))
        compiled = study.compensated_momenta
        lines += [f"{setup.title}, compensation on: loss after {setup.updates} updates over the compiled {setting} "
                  f"(the total compensation steers towards; g = 1: the same {setting}, nothing to compensate)", "",
                  "| g | " + " | ".join(map(_setting, compiled)) + " | best | best over the best uncompensated |",
                  "|---|" + "---|" * (len(compiled) + 2)]
        for g in setup.groups:
            by = off if g == 1 else on
            means = {m: mean_loss(by[(g, m)]) for m in compiled}
            lowest = min(means, key=lambda m: (means[m], m))
            cells = [f"{means[m]:.4f}" if math.isfinite(means[m]) else "inf" for m in compiled]
            lines.append(f"| {g} | " + " | ".join(cells) + f" | {_setting(lowest)} | {_rounded(ratios.get(g, math.nan))} |")
        lines.append("")
    lines += [f"![Loss over explicit {setting} (compensated: the compiled {setting}); the best {setting} and the total "
              f"momentum]({plot}momentum.png)", ""]
    if 3 in study.experiments:
        lines += tuned_markdown(results)
    if 4 in study.experiments:
        lines += hardware_markdown(measured)
    lines += ["Figures:", "", "```", json.dumps(figures), "```", "", end]
    return "\n".join(lines)


def tuned_markdown(results: dict[Setup, list[dict]]) -> list[str]:
    """Experiment 3's part of the results."""
    lines = ["### Tuned asynchrony against tuned synchrony (experiment 3)", ""]
    for setup, trials in results.items():
        tuned, ratios = best_tuned(trials), tuned_over_sync(trials)
        lines += [f"{setup.title}: the fewest mean updates to loss {setup.target_loss} over learning rates "
                  f"{_listed(sorted(setup.learning_rates))} and every momentum, compensation off and on (at "
                  f"{setup.learning_rates[0]}), checked at every tenth of a trial's {setup.updates} updates "
                  "(≥: not reached in every seed, counted by the trial's updates)", "",
                  "| g | learning rate | momentum | compensated | updates to the target | over the synchronous |",
                  "|---|---|---|---|---|---|"]
        for g in setup.groups:
            chosen = tuned[g]
            bound = "" if chosen.reached else "≥ "
            lines.append(
                f"| {g} | {chosen.learning_rate} | {chosen.momentum:+.1f} | {'yes' if chosen.compensated else 'no'} | "
                f"{bound}{chosen.updates:.0f} | {bound}{_rounded(ratios.get(g, 1.0))} |"
            )
        lines.append("")
    return lines


def hardware_markdown(measured: dict[int, float] | None) -> list[str]:
    """Experiment 4's part of the results."""
    lines = ["### Hardware model (experiment 4)", ""]
    if measured is None:
        lines.append("Left out: this machine could not emulate the cluster.")
    else:
        errors = he_errors(measured)
        known = [g for g in sorted(measured) if g not in errors]
        lines += [f"| g | measured s/update | predicted from g = {_listed(known)} | error |", "|---|---|---|---|"]
        for g in sorted(measured):
            predicted, error = errors.get(g, (math.nan, math.nan))
            lines.append(f"| {g} | {measured[g]:.4f} | {_rounded(predicted, 4)} | {_rounded(error)} |")
        lines += ["", "![Hardware model](science_hardware.png)"]
    return [*lines, ""]


def write_page(path: pathlib.Path, results_section: str, markers: tuple[str, str] = (START, END)) -> None:
    """Replaces the results between the `markers`, keeping the rest of the page (another
    optimizer's results too); a page without them gets them at its end."""
    start, end = markers
    text = path.read_text() if path.exists() else "# omnikeras science\n"
    if start not in text:
        text = f"{text.rstrip()}\n\n{start}\n{end}\n"
    before, _, rest = text.partition(start)
    _, _, after = rest.partition(end)
    path.write_text(before + results_section + after)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="digits only, fewer updates, one seed")
    parser.add_argument(
        "--optimizer", choices=sorted(STUDIES), default="sgd", help="adam: experiments 1 and 2 with Adam's beta_1"
    )
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("docs"), help="where science.md and its plots go")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    study = STUDIES[args.optimizer]
    setups = study.quick if args.quick else study.full
    if 3 not in study.experiments:
        log(f"--optimizer {study.optimizer} runs experiments 1 and 2 only: 3 and 4 run with --optimizer sgd")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        work = pathlib.Path(directory)
        emulated = emulated_spec(args.quick, work)
        results: dict[Setup, list[dict]] = {}
        for setup in setups:
            log(
                f"{setup.title}, {study.title}: {setup.workers} workers "
                f"({'a host each of ' + emulated if emulated else 'on this host'}), groups {setup.groups}, "
                f"learning rates {setup.learning_rates}, {study.setting} {study.momenta}, {setup.updates} updates per trial"
            )
            results[setup] = [trial for seed in setup.seeds for trial in run_seed(study, setup, seed, work, emulated)]
        emulated_name = ClusterSpec.load(emulated).name if emulated else None
        measured = None
        if emulated and 4 in study.experiments:
            log("hardware model: seconds per update on the emulated cluster")
            measured = measure_hardware(args.quick, emulated, work)
    base = uncompensated_at_first_rate(results)
    figures = figures_of(study, results, measured)
    for setup, trials in base.items():
        log(f"{setup.title}: best explicit {study.setting} by groups {best_momenta(trials)}")
    plot_implicit(study, base, args.out / f"science_{study.prefix}implicit_momentum.png")
    plot_grid(
        study, {setup: at_rate(trials, setup.learning_rates[0]) for setup, trials in results.items()},
        args.out / f"science_{study.prefix}momentum.png",
    )
    if measured:
        plot_hardware(measured, he_errors(measured), args.out / "science_hardware.png")
    where = f"on the emulated cluster {emulated_name}, one worker per host" if emulated_name else "as processes on one host"
    write_page(args.out / "science.md", results_markdown(study, results, measured, figures, where), study.markers)
    log(f"results written to {args.out / 'science.md'}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
