"""Chooses TensorFlow's CPU thread settings by measuring each candidate."""

import sys
from collections.abc import Sequence

from omnikeras.profiles.isolated import measure_isolated
from omnikeras.profiles.threads import ThreadSettings, candidate_settings


def search_thread_settings(
    model: str,
    batch_size: int,
    candidates: Sequence[ThreadSettings] | None = None,
    repeats: int = 3,
    seconds: float = 1.0,
    label: str = "",
) -> tuple[ThreadSettings, dict[ThreadSettings, float]]:
    """The thread settings under which `model` trains fastest on the CPU at `batch_size`.

    Each candidate is measured in a fresh process (TensorFlow fixes its threads when its
    runtime starts), one after the other so that they do not compete for the cores. Ties
    go to the candidate with fewer threads, listed first.

    Args:
        model: `MODULE:FUNCTION` that builds the model.
        batch_size: The batch size to measure at.
        candidates: The settings to try; defaults to `candidate_settings()`.
        repeats, seconds: Timed runs per candidate, and about how long each lasts.
        label: Prefix of the progress lines on stderr.

    Returns:
        The best settings, and every candidate's median examples/s.

    Example:

    >>> best, rates = search_thread_settings("omnikeras.profiles.reference_cnn:reference_cnn", 64)
    >>> best
    ThreadSettings(intra_op=2, inter_op=1)
    """
    rates: dict[ThreadSettings, float] = {}
    for settings in candidates or candidate_settings():
        prefix = f"{label}threads {settings.intra_op}/{settings.inter_op} (intra/inter), "
        rate = measure_isolated(model, [batch_size], settings, "/CPU:0", repeats, seconds, prefix)
        rates[settings] = rate.examples_per_second[0]
        print(f"{prefix}median {rates[settings]:.0f} examples/s", file=sys.stderr, flush=True)
    best = max(rates, key=lambda s: rates[s])
    return best, rates
