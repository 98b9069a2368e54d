"""Compensated asynchrony: the momentum and learning rate in force, so that asynchronous
groups train with the momentum and step the model was compiled with.

Asynchrony begets momentum (arXiv 1605.09774): with gradients `s` updates stale on
average, the updates behave as if they carried an implicit momentum `s / (1 + s)`, which
is `1 - 1/g` for g groups taking turns, and the total momentum is about the explicit one
plus the implicit one (Omnivore, Hadjis et al. 2016, found the best explicit momentum to
fall with the groups as that sum says: 0.9, 0.6, 0.3 and 0.0 at 1, 2, 4 and 8 groups in
omnikeras' own study). So, with `s` the mean staleness the server measured over its
recent updates, the explicit momentum in force is what the implicit one leaves of the
compiled momentum:

    momentum_in_force = compiled_momentum - s / (1 + s)

down to `MIN_MOMENTUM` where the implicit momentum alone is larger (the papers report
that negative momentum can help). The learning rate in force keeps the effective step, a
gradient's whole weight over the updates it takes part in, `learning_rate / (1 -
momentum)`:

    learning_rate_in_force = step * (1 - momentum_in_force)
    step = min(compiled_learning_rate / (1 - compiled_momentum), guard's cap)

Stale gradients also make a large step unstable where the synchronous step was not (a
delay of `s` updates shrinks the largest stable step times curvature from `2 (1 + mu) /
(1 - mu)` for heavy-ball momentum `mu` to about `1.5 / (s + 0.5)`), so `StepGuard` caps
the step for each number of groups: a warm-up from the share of the compiled step that
stays stable wherever the compiled step was, growing while the training loss the
workers push improves, and a halving where that loss climbs or a gradient spikes (one
computed at weights the step threw off, which is applied at the gradients' usual size).

A gradient far staler than the usual (a group that started late, or stalled) is damped:
it keeps `OUTLIER * (1 + s) / (1 + its staleness)` of its weight, where that is below 1.

With one group every gradient is current: the compiled rule applies unchanged.

Optimizers other than SGD (see `optimizers.base.MomentumForm`):
- RMSprop's momentum accumulates its steps as SGD's does ("heavy ball"): compensated as
  above.
- The `beta_1` of Adam's family (Lamb's too) and Lion's is a moving average of the
  gradients ("average"), whose effective step is the learning rate itself: the explicit `beta_1` in
  force is what the implicit momentum leaves of the compiled one, down to 0 (a negative
  average has no meaning), and the learning rate in force is the capped step. Muon's
  `momentum` is compensated alike: its orthogonalized update's size is the learning rate's
  whatever the momentum (the `adam_beta_1` of the variables it leaves to AdamW stays as
  compiled).
- Adagrad, Adadelta, Adafactor, Ftrl and ScheduleFreeAdamW have no momentum-like setting
  the theory speaks of ("none"): only the step is capped.
What the theory does not cover: it is derived for SGD, where an update is the gradient
times the rate. An adaptive optimizer divides each update by a running measure of the
gradients' size, which the staleness changes little, so the implicit momentum still adds
to `beta_1`; but the stability limit `StepGuard` starts from is the heavy-ball one, an
estimate for them rather than a derived bound, and Lion's sign update has no curvature
limit of that kind at all.
"""

import collections
import copy
from dataclasses import dataclass

from omnikeras.parameter_server.optimizers import MomentumForm
from omnikeras.parameter_server.step_guard import StepGuard

# A gradient more than this many times staler than the updates' usual (one of a group that
# started late or stalled) keeps only that share of its weight: it was computed on weights
# long replaced, and applied whole it can throw the model off where no curvature limits it.
OUTLIER = 2.0
# Negative momentum damps the oscillations of stale updates, but no further than this.
MIN_MOMENTUM = -0.3
# Updates whose staleness makes up the measurement; until there are as many, it leans on
# the staleness of groups taking turns, `g - 1`, as if measured over `PRIOR_UPDATES`.
WINDOW = 256
PRIOR_UPDATES = 16


def effective_step(learning_rate: float, momentum: float, form: MomentumForm) -> float:
    """A gradient's whole weight over the updates it takes part in: `learning_rate / (1 -
    momentum)` where steps accumulate, the learning rate itself otherwise."""
    return learning_rate / (1 - momentum) if form == "heavy ball" else learning_rate


# What the step guards learned, by number of groups.
Guards = dict[int, StepGuard]


@dataclass(frozen=True)
class InForce:
    """The rule as the server applies it at one update."""

    learning_rate: float
    momentum: float
    # The momentum the staleness alone adds: `s / (1 + s)`.
    implicit_momentum: float


class AsynchronyCompensation:
    """The momentum and learning rate in force for the staleness the server measures.

    Args:
        num_groups: The groups in the present layout.

    Example:

    >>> compensation = AsynchronyCompensation(num_groups=4)
    >>> for _ in range(300):  # four groups taking turns
    ...     compensation.record(staleness=3.0, loss=1.0)
    >>> rule = compensation.in_force(learning_rate=0.01, momentum=0.9)
    >>> round(rule.momentum, 3), round(rule.implicit_momentum, 3)
    (0.15, 0.75)
    """

    def __init__(self, num_groups: int = 1) -> None:
        self.num_groups = num_groups
        self._staleness: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self._staleness_sum = 0.0
        # What the guards learned of each number of groups: a return to one keeps it.
        self._guards: Guards = {}

    def regroup(self, num_groups: int) -> None:
        """The groups changed: the staleness is measured afresh."""
        self.num_groups = num_groups
        self._staleness.clear()
        self._staleness_sum = 0.0

    def guards(self) -> Guards:
        """A copy of what the guards learned, to keep with a snapshot of the weights."""
        return copy.deepcopy(self._guards)

    def weights_replaced(self, guards: Guards | None = None) -> None:
        """The weights were put back (a snapshot restored): their gradients start afresh,
        under the `guards` kept with those weights where given."""
        if guards is not None:
            self._guards = copy.deepcopy(guards)
        for guard in self._guards.values():
            guard.restart()

    def record(self, staleness: float, loss: float | None) -> None:
        """Records an applied update: its mean staleness (over its gradients, weighted by
        their share) and the training loss of its gradients (None when unknown)."""
        if len(self._staleness) == WINDOW:
            self._staleness_sum -= self._staleness[0]
        self._staleness.append(staleness)
        self._staleness_sum += staleness
        guard = self._guards.get(self.num_groups)
        if guard is not None:
            guard.record(loss)

    @property
    def staleness(self) -> float:
        """The mean staleness of the recent updates, leaning on `g - 1` until measured."""
        prior = self.num_groups - 1
        return (prior * PRIOR_UPDATES + self._staleness_sum) / (PRIOR_UPDATES + len(self._staleness))

    @property
    def implicit_momentum(self) -> float:
        """The momentum the staleness alone adds, `s / (1 + s)`."""
        return self.staleness / (1 + self.staleness)

    @property
    def backoffs(self) -> int:
        """How often a guard halved the step, over every number of groups."""
        return sum(guard.backoffs for guard in self._guards.values())

    def weight_of(self, staleness: float) -> float:
        """The share of its weight that a gradient `staleness` updates old keeps.

        >>> compensation = AsynchronyCompensation(num_groups=2)  # staleness 1 expected
        >>> compensation.weight_of(1.0), compensation.weight_of(39.0)
        (1.0, 0.1)
        """
        if self.num_groups == 1:
            return 1.0
        return min(1.0, OUTLIER * (1 + self.staleness) / (1 + staleness))

    def in_force(self, learning_rate: float, momentum: float, form: MomentumForm = "heavy ball") -> InForce:
        """The rule for the next update, for the compiled `learning_rate` (at this
        iteration) and `momentum` (the optimizer's momentum-like setting, of `form`)."""
        if self.num_groups == 1:
            return InForce(learning_rate, momentum, self.implicit_momentum)
        if form == "none":
            return InForce(self._guard(0.0).cap(learning_rate), momentum, self.implicit_momentum)
        # Never above the compiled momentum, which may itself lie below the floor.
        floor = MIN_MOMENTUM if form == "heavy ball" else 0.0
        explicit = min(momentum, max(momentum - self.implicit_momentum, floor))
        step = self._guard(momentum).cap(effective_step(learning_rate, momentum, form))
        return InForce(step * (1 - explicit) if form == "heavy ball" else step, explicit, self.implicit_momentum)

    def share(self, magnitude: float) -> float:
        """The share of a gradient whose sum of magnitudes is `magnitude` that the next
        update applies (see `StepGuard.share`); all of it with one group."""
        # One group has no guard: `in_force` applies the compiled rule unchanged.
        guard = self._guards.get(self.num_groups)
        return 1.0 if guard is None else guard.share(magnitude)

    def _guard(self, momentum: float) -> StepGuard:
        guard = self._guards.get(self.num_groups)
        if guard is None:
            guard = self._guards[self.num_groups] = StepGuard(start=self._safe_share(momentum))
        return guard

    def _safe_share(self, momentum: float) -> float:
        """The share of the compiled step that stays stable under the staleness wherever
        the compiled step was stable without it: the ratio of the two limits on the step
        times the curvature, about `1.5 / (s + 0.5)` with `s` updates of delay (whatever
        the momentum; solved for the linear recurrence) and `2 (1 + mu) / (1 - mu)` for
        heavy-ball momentum `mu` without."""
        return min(1.0, 1.5 / (self.staleness + 0.5) / (2 * (1 + momentum) / (1 - momentum)))
