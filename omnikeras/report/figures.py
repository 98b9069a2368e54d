"""The report's PNG figures: Optuna's own plots of the study, and omnikeras' plots of
what the convergence-time model predicted, what each phase chose and how the loss fell."""

import math
import pathlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import optuna
import optuna.visualization.matplotlib as optuna_plots
from matplotlib import pyplot
from matplotlib.axes import Axes
from matplotlib.figure import Figure as MatplotlibFigure

from omnikeras.tuner.records import LOSS_CURVE, PhaseRecord, TrialRecord


@dataclass(frozen=True)
class Figure:
    """One figure of the report: its PNG file, or why it could not be drawn."""

    title: str
    file: str | None = None
    reason: str | None = None


def draw_figures(study: optuna.Study, out: pathlib.Path) -> list[Figure]:
    """Writes every figure it can draw into `out` as a PNG; a figure the study has no
    data for comes back with the reason instead of a file.

    Example:

    ```python
    for figure in draw_figures(optuna.load_study(study_name="omnivore", storage=url), pathlib.Path("report")):
        print(figure.title, figure.file or figure.reason)
    ```
    """
    drawers: list[tuple[str, str, Callable[[optuna.Study], Axes | MatplotlibFigure | str]]] = [
        ("Optimization history", "history.png", _history),
        ("Intermediate values", "intermediate_values.png", _intermediate_values),
        ("Parameter importances", "param_importances.png", _param_importances),
        ("Seconds per update over the number of groups", "seconds_per_update.png", _seconds_per_update),
        ("Configuration chosen in each phase", "phases.png", _phases),
        ("Loss curve", "loss_curve.png", _loss_curve),
    ]
    figures = []
    for title, file, draw in drawers:
        drawn = draw(study)
        if isinstance(drawn, str):
            figures.append(Figure(title, reason=drawn))
            continue
        figure = drawn if isinstance(drawn, MatplotlibFigure) else drawn.get_figure(root=True)
        assert figure is not None
        figure.savefig(out / file, dpi=100, bbox_inches="tight")
        # Optuna draws through pyplot, which keeps its figures until closed; ours never
        # enter pyplot, and closing them is a no-op.
        pyplot.close(figure)
        figures.append(Figure(title, file=file))
    return figures


# Optuna's plots ---------------------------------------------------------------------------


def _history(study: optuna.Study) -> Axes | str:
    if not _completed(study):
        return "no trial completed (pruned, diverged and interrupted trials have no value)"
    return _optuna_plot(optuna_plots.plot_optimization_history, study)


def _intermediate_values(study: optuna.Study) -> Axes | str:
    if not any(trial.intermediate_values for trial in study.trials):
        return "no trial reported an intermediate loss"
    return _optuna_plot(optuna_plots.plot_intermediate_values, study)


def _param_importances(study: optuna.Study) -> Axes | str:
    completed = _completed(study)
    if len(completed) < 2:
        return f"needs at least 2 completed trials; the study has {len(completed)}"
    if all(trial.params == completed[0].params for trial in completed):
        return "every completed trial has the same parameters"
    try:
        return _optuna_plot(optuna_plots.plot_param_importances, study)
    except (ValueError, RuntimeError) as error:
        return f"Optuna could not evaluate them: {error}"


def _optuna_plot(plot: Callable[[optuna.Study], Axes], study: optuna.Study) -> Axes:
    with warnings.catch_warnings():
        # Optuna marks its matplotlib plots experimental; the report uses them as they are.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        axes = plot(study)
    figure = axes.get_figure(root=True)
    assert figure is not None
    figure.set_size_inches(8, 5)
    return axes


# omnikeras' plots -------------------------------------------------------------------------


def _seconds_per_update(study: optuna.Study) -> MatplotlibFigure | str:
    rows = [
        (trial.params["num_groups"], record.predicted_seconds_per_update, record.measured_seconds_per_update)
        for trial in study.trials
        if "num_groups" in trial.params and (record := TrialRecord.read(trial)) is not None
    ]
    predicted = [(g, p) for g, p, _ in rows if _finite(p)]
    measured = [(g, m) for g, _, m in rows if _finite(m)]
    timed = [(g, s) for phase in PhaseRecord.read_all(study) for g, s in phase.seconds_per_update.items() if _finite(s)]
    if not predicted and not measured and not timed:
        return "no trial recorded its seconds per update"
    figure, axes = _new_figure()
    if timed:
        axes.scatter(*_columns(timed), marker="s", s=40, alpha=0.7, label="timed (each phase)")
    if measured:
        axes.scatter(*_columns(measured), marker="o", s=40, alpha=0.7, label="measured (trials)")
    if predicted:
        axes.scatter(*_columns(predicted), marker="x", s=50, label="predicted")
    axes.set_xscale("log", base=2)
    groups = sorted({g for g, _ in predicted + measured + timed})
    axes.set_xticks(groups, labels=[str(g) for g in groups])
    axes.minorticks_off()
    axes.set_xlabel("number of groups")
    axes.set_ylabel("seconds per update")
    axes.set_title("Hardware efficiency: predicted vs measured")
    axes.legend()
    return figure


def _phases(study: optuna.Study) -> MatplotlibFigure | str:
    chosen = PhaseRecord.read_all(study)
    if not chosen:
        return "no phase finished tuning"
    numbers = [phase.index for phase in chosen]
    figure = MatplotlibFigure(figsize=(8, 7))
    panels = figure.subplots(4, 1, sharex=True)
    for axes, key, label in zip(panels, ("num_groups", "learning_rate", "momentum"), ("groups", "learning rate", "momentum")):
        axes.plot(numbers, [getattr(phase.config, key) for phase in chosen], marker="o")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
    panels[1].set_yscale("log")
    tuning = [phase.tuning_seconds for phase in chosen]
    panels[3].bar(numbers, tuning, label="tuning")
    panels[3].bar(numbers, [phase.training_seconds for phase in chosen], bottom=tuning, label="training")
    panels[3].set_ylabel("seconds")
    panels[3].legend()
    panels[3].set_xlabel("phase")
    panels[3].set_xticks(numbers)
    panels[0].set_title("Configuration chosen in each phase")
    return figure


def _loss_curve(study: optuna.Study) -> MatplotlibFigure | str:
    curve = [(seconds, loss) for seconds, _, loss in study.user_attrs.get(LOSS_CURVE, []) if _finite(loss)]
    if not curve:
        return "the study holds no loss curve (training had not ended when it was read, or was too short)"
    figure, axes = _new_figure()
    axes.plot(*zip(*curve))
    if all(loss > 0 for _, loss in curve):
        axes.set_yscale("log")
    # Each phase tunes, then trains for the recorded time: where the next one begins.
    start = 0.0
    for phase in PhaseRecord.read_all(study):
        start += phase.tuning_seconds + phase.training_seconds
        if start >= curve[-1][0]:
            break
        axes.axvline(start, color="gray", linestyle="--", linewidth=0.8)
        axes.annotate(f"phase {phase.index + 1}", (start, 1), xycoords=("data", "axes fraction"), va="top", fontsize=8)
    axes.set_xlabel("seconds since training began")
    axes.set_ylabel("training loss (chief's batches)")
    axes.set_title("Loss curve")
    return figure


# Helpers ----------------------------------------------------------------------------------


def _completed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _columns(points: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    return [x for x, _ in points], [y for _, y in points]


def _new_figure() -> tuple[MatplotlibFigure, Axes]:
    figure = MatplotlibFigure(figsize=(8, 5))
    axes = figure.subplots()
    axes.grid(alpha=0.3)
    return figure, axes


