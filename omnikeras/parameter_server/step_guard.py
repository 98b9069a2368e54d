"""A cap on the effective step of asynchronous updates, learnt from the training loss.

A delay of `s` updates shrinks the largest stable step along the curvature that limits
it (for heavy-ball momentum `mu` and one update of delay, from `2 (1 + mu) / (1 - mu)`
over the curvature to about `1`), and nothing the server sees tells that curvature
beforehand. So the cap warms up, from a fraction of the compiled step (never below that
fraction of it until a first halving: a learning-rate schedule's own warm-up may start
at 0) by `GROWTH` per update while the training loss the workers push with their
gradients holds its best level over many updates (within that level's noise), and stops
growing while it lies above. Where the loss over the last few updates (`SHORT`) climbs clearly past its level
over many (`LONG`), by a factor `RISE` and by `SIGMAS` standard deviations of its own
noise, or that level climbs past its best by a factor `DRIFT` and its noise (all
measured on the logarithm of the loss, whose batch-to-batch noise is about a constant
factor), the step in force is halved, held for `HOLD` updates, and the warm-up resumes
at half its pace, so that the cap settles below the edge of stability instead of
oscillating across it.

A step past the edge throws the weights off within an update or two, before any average
of the loss climbs: the gradients computed at the thrown weights are many times their
usual size, and applied whole they throw the weights further, each group's step feeding
the next. So a gradient whose sum of magnitudes spikes past `SPIKE` times their usual
level (an average over `LONG` updates, of their logarithm) is applied at `SPIKE` times
that level, and the step backs off as for a climb. Without losses (a worker that does
not know them, or a loss that is not positive, such as a cosine similarity's) the cap
only warms up from the losses' side.
"""

import math

GROWTH = 1.04
MIN_GROWTH = 1.001
RISE = 1.1
DRIFT = 1.25
SIGMAS = 4.0
BACKOFF = 0.5
SHORT = 8
LONG = 64
HOLD = 64
# Losses seen before the noise is known well enough to judge a climb, and gradients seen
# before their usual size is known well enough to judge a spike.
SETTLE = 32
# A gradient this many times its usual size was computed at thrown weights: the
# batch-to-batch spread of the magnitudes is within a factor of about 2 at batch 32.
SPIKE = 5.0

_SHORT_WEIGHT = 2 / (SHORT + 1)
_LONG_WEIGHT = 2 / (LONG + 1)
# The standard deviation of each average over that of one loss, for independent losses:
# an exponential average of weight `a` has variance `a / (2 - a)` of theirs.
_SHORT_NOISE = math.sqrt(_SHORT_WEIGHT / (2 - _SHORT_WEIGHT))
_LONG_NOISE = math.sqrt(_LONG_WEIGHT / (2 - _LONG_WEIGHT))


class StepGuard:
    """The effective step that the updates of one layout may take.

    Args:
        start: The cap at the first update, as a fraction of the compiled step.

    Example:

    >>> guard = StepGuard(start=0.25)
    >>> guard.cap(1.0)
    0.25
    >>> for k in range(200):  # a loss that falls: the warm-up runs its course
    ...     guard.record(2.0 - 0.001 * k)
    >>> guard.cap(1.0)
    1.0
    >>> for k in range(12):  # then one that climbs, update after update
    ...     guard.record(1.8 * 1.2 ** k)
    >>> guard.cap(1.0), guard.backoffs
    (0.5, 1)
    """

    def __init__(self, start: float) -> None:
        self.start = start
        self.backoffs = 0
        self._cap: float | None = None
        self._step = 0.0
        self._compiled = 0.0
        self._growth = GROWTH
        self._hold = 0
        self._short: float | None = None
        self._long = 0.0
        self._variance = 0.0
        self._best = 0.0
        self._seen = 0
        # Whether the loss is at its best level: the step grows only while it improves.
        self._improving = True
        # The logarithm of the gradients' usual sum of magnitudes, over how many.
        self._magnitude_level = 0.0
        self._magnitudes_seen = 0
        self._spiked = False

    def cap(self, step: float) -> float:
        """The step in force where the compiled effective step is `step`."""
        if not self.backoffs:
            # Until the loss shows a step too large, the start's share of the compiled step
            # is safe: a schedule that warms up from 0 raises the cap with it.
            self._cap = max(self._cap or 0.0, self.start * step)
        assert self._cap is not None
        self._compiled = step
        self._step = min(step, self._cap)
        return self._step

    def share(self, magnitude: float) -> float:
        """The share of a gradient whose sum of magnitudes is `magnitude` that the next
        update applies: all of it, unless it spikes past `SPIKE` times the usual level."""
        if magnitude <= 0 or not math.isfinite(magnitude):
            return 1.0
        level = math.log(magnitude)
        limit = self._magnitude_level + math.log(SPIKE)
        self._spiked = self._magnitudes_seen >= SETTLE and level > limit
        self._magnitudes_seen += 1
        # A spike enters the level as the size it is applied at.
        applied = limit if self._spiked else level
        self._magnitude_level += (applied - self._magnitude_level) / min(self._magnitudes_seen, LONG)
        return math.exp(limit) / magnitude if self._spiked else 1.0

    def restart(self) -> None:
        """The weights changed under the losses and gradients: their levels are measured
        afresh."""
        self._short = None
        self._magnitudes_seen = 0
        self._hold = 0
        self._improving = True

    def record(self, loss: float | None) -> None:
        """Records the update just applied (at the step `cap` last gave) and the training
        loss of its gradients, None when unknown."""
        if self._cap is None:
            return
        spiked, self._spiked = self._spiked, False
        climbed = loss is not None and 0 < loss < math.inf and self._climbed(math.log(loss))
        # The spikes of one throw, while the step is held, back it off once.
        if (spiked and not self._hold) or climbed:
            self._cap = BACKOFF * self._step
            self._hold = HOLD
            self._growth = max(1 + (self._growth - 1) / 2, MIN_GROWTH)
            self.backoffs += 1
            return
        if self._hold:
            self._hold -= 1
            return
        if self._improving:
            # No further than the compiled step: a rate raised later warms up again (from
            # the start's share of it, until a first halving).
            self._cap = min(self._cap * self._growth, self._compiled)

    def _climbed(self, level: float) -> bool:
        """Whether the loss, with one of logarithm `level` in, climbed past its level
        (outside a hold)."""
        if self._short is None:
            self._short = self._long = level
            self._variance = 0.0
            self._best = level
            self._seen = 0
        self._seen += 1
        self._short += (level - self._short) * _SHORT_WEIGHT
        # The noise as it was before this loss: a climb must not widen its own margin.
        noise = SIGMAS * math.sqrt(self._variance)
        deviation = level - self._long
        self._long += deviation * _LONG_WEIGHT
        self._variance += (deviation * deviation - self._variance) * _LONG_WEIGHT
        if self._seen < SETTLE:
            self._best = self._long
            return False
        # At its best level within the noise of its average: a small step lowers the loss
        # too slowly for new bests to stand out of the noise, and would never grow.
        self._improving = self._long <= self._best + _LONG_NOISE * noise
        if self._hold:
            self._best = min(self._best, self._long)
            return False
        # A sudden climb over the last few losses, or a slow one away from the best level.
        sudden = self._short - self._long > max(math.log(RISE), _SHORT_NOISE * noise)
        # (The best of a noisy level lies below its mean by a few of its deviations.)
        slow = self._long - self._best > math.log(DRIFT) + _LONG_NOISE * noise
        self._best = min(self._best, self._long)
        if not (sudden or slow):
            return False
        # Climbs are measured from the level reached.
        self._long = self._best = self._short
        return True
