"""The report itself: one self-contained `index.html` beside the figures' PNGs."""

import dataclasses
import html
import math
import pathlib
from collections import Counter

import optuna

from omnikeras.report.figures import Figure, draw_figures
from omnikeras.tuner import records
from omnikeras.tuner.records import PhaseRecord, TrialRecord

# The trial attributes the tuner records, in the order the table shows them.
_TRIAL_ATTRS = tuple(field.name for field in dataclasses.fields(TrialRecord))
_PARAMS = tuple(records.PARAMS)
_STYLE = """
body { font-family: sans-serif; max-width: 70em; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; }
img { max-width: 100%; }
.missing { color: #a33; }
"""


def write_report(study: optuna.Study, out: str | pathlib.Path) -> pathlib.Path:
    """Writes the figures and `index.html` of `study` into `out` (created if needed) and
    returns the HTML file's path. The page links its figures by relative path, so the
    folder can be moved or served as it is.

    Example:

    ```python
    study = omnikeras.report.load_study("sqlite:///runs/omnivore.db")
    print(write_report(study, "runs/report"))
    ```
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = draw_figures(study, out)
    page = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>Omnivore study {_e(study.study_name)}</title>",
            f"<style>{_STYLE}</style></head><body>",
            f"<h1>Omnivore study {_e(study.study_name)}</h1>",
            _summary(study),
            _figures(figures),
            _trials(study),
            "</body></html>",
        ]
    )
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def mean_prediction_error(study: optuna.Study) -> float:
    """Mean of |predicted - measured| / measured seconds per update over the trials that
    recorded both; NaN when none did."""
    errors = []
    for trial in study.trials:
        record = TrialRecord.read(trial)
        if record is None:
            continue
        predicted, measured = record.predicted_seconds_per_update, record.measured_seconds_per_update
        if _finite(predicted) and _finite(measured) and measured > 0:
            errors.append(abs(predicted - measured) / measured)
    return sum(errors) / len(errors) if errors else math.nan


def _summary(study: optuna.Study) -> str:
    states = Counter(trial.state.name.lower() for trial in study.trials)
    lines = [f"{len(study.trials)} trials: " + ", ".join(f"{count} {state}" for state, count in sorted(states.items()))]
    completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if completed:
        best = study.best_trial
        lines.append(
            f"Best trial: #{best.number} (phase {_cell(best.user_attrs.get('phase'))}), predicted time to target "
            f"{_cell(best.value)} s with {records.words(records.config_of(best.params))}"
        )
    else:
        lines.append("Best trial: none completed")
    error = mean_prediction_error(study)
    lines.append(
        "Mean prediction error of seconds per update: "
        + ("no trial measured it" if math.isnan(error) else f"{100 * error:.1f}%")
    )
    phase_lines = [
        f"phase {phase.index}: {records.words(phase.config)} (tuned in {phase.tuning_seconds:.1f} s, "
        f"then trained for {phase.training_seconds:.0f} s)"
        for phase in PhaseRecord.read_all(study)
    ] or ["no phase finished tuning"]
    return (
        "<h2>Summary</h2>\n<ul>\n"
        + "".join(f"<li>{_e(line)}</li>\n" for line in lines)
        + "</ul>\n<h3>Chosen in each phase</h3>\n<ul>\n"
        + "".join(f"<li>{_e(line)}</li>\n" for line in phase_lines)
        + "</ul>"
    )


def _figures(figures: list[Figure]) -> str:
    parts = ["<h2>Figures</h2>"]
    for figure in figures:
        parts.append(f"<h3>{_e(figure.title)}</h3>")
        if figure.file is not None:
            parts.append(f'<p><img src="{_e(figure.file)}" alt="{_e(figure.title)}"></p>')
        else:
            parts.append(f'<p class="missing">Not drawn: {_e(figure.reason or "")}.</p>')
    return "\n".join(parts)


def _trials(study: optuna.Study) -> str:
    columns = ("number", "state", "value", *_PARAMS, *_TRIAL_ATTRS)
    rows = [
        [trial.number, trial.state.name.lower(), trial.value]
        + [trial.params.get(name) for name in _PARAMS]
        + [trial.user_attrs.get(name) for name in _TRIAL_ATTRS]
        for trial in study.trials
    ]
    header = "".join(f"<th>{_e(column)}</th>" for column in columns)
    body = "".join("<tr>" + "".join(f"<td>{_e(_cell(value))}</td>" for value in row) + "</tr>\n" for row in rows)
    return f"<h2>Trials</h2>\n<table>\n<tr>{header}</tr>\n{body}</table>"


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "∞" if value == math.inf else f"{value:.4g}"
    return str(value)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _e(text: str) -> str:
    return html.escape(text, quote=True)
