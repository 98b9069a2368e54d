"""Which configurations to try: the Omnivore prototype's search, phase by phase.

Phase 0 (cold start) begins with the settings the model was compiled with and, where
more groups pay, the momentum grid at the most asynchronous number of groups worth
having with the compiled learning rate, then runs the prototype's cold start:
synchronous (g = 1) with momentum 0.9 and learning rates from 0.1 down to 0.0001
(nearest to the compiled one first); if the best sits on the edge of that range, the
range widens, and the best's neighbours half a decade away are tried too. Then, at the
number of groups the caller measured to be the most asynchronous worth having, the
momentum grid {0, 0.3, 0.6, 0.9} x learning rate {best, best / 10} (the momenta that
bring the total, with asynchrony's 1 - 1/g, nearest 0.9 first); while the grid's best
momentum at g is 0, asynchrony brings too much momentum by itself and g halves. At the
last g, the best momentum is refined half a grid step either way (0.6 gives 0.45, 0.75).

Later phases search again at the current number of groups, with the current learning rate
and its tenth. A configuration more aggressive (as many groups or more, as large a
learning rate or larger, as much momentum or more) than one that diverged is skipped.

Each phase starts from an incumbent, the compiled settings in the cold start and the
current ones later, tried twice: the two trials of one configuration measure how far
trials differ by chance alone. The phase ends with the best configuration it tried, by
`rank` (least time to target, then fewer groups, smaller learning rate, less momentum),
where that beats the incumbent by more than that spread (`KEEP_MARGIN` at least); else
with the incumbent: a short trial's noise does not move training off settings that work.

With compensated asynchrony (the server's default with more than one group) a
configuration's momentum is the total the server keeps, whatever the groups, and the
search starts from the compensated configuration instead of a cold grid: phase 0 tries
nothing and returns the compiled learning rate and momentum at the most asynchronous
number of groups worth having (compensation keeps the statistical efficiency of an
update, so the hardware's timing decides the groups). Later phases try few candidates
around the current configuration, so that each trial is long enough for momentum to
act: the learning rate half a decade up, then the best's momentum half a grid step
either way at the same effective step (`learning_rate / (1 - momentum)`). Nothing with a
smaller step is tried: the server's step guard brings the step down where it is
unstable, and a short trial favours a smaller step, whose loss settles sooner to a level
a longer run would leave behind. Compensation takes asynchrony's momentum out, so no
number of groups is given up for bringing too much of it.

These trials continue from one another instead of each starting from the phase's
snapshot (`trials_continue`): every update of a trial that does not diverge is
training kept, so that tuning costs only what a worse candidate trains more slowly.
Each candidate runs between two trials of the incumbent and is scored against the
geometric mean of those two, which cancels the slowing of the loss as training goes on;
the spread is how far a trial of the incumbent lies from the geometric mean of those
either side of it, or, with two, their whole difference.

A phase stops after `max_trials` trials: the candidates come most promising first, so a
short run drops the least promising rather than overrun its tuning budget.

The search only decides; its caller runs each configuration and sends back the outcome:

    phase = search.phase(0, start_groups=4)
    config = next(phase)
    while True:
        try:
            config = phase.send(run(config))
        except StopIteration as done:
            chosen = done.value
            break
"""

import math
from collections.abc import Generator
from dataclasses import dataclass

from omnikeras.convergence.momentum import implicit_momentum
from omnikeras.parameter_server.optimizers import MomentumForm

# The least a candidate must beat the incumbent by, as a share of its time to target.
KEEP_MARGIN = 0.1


@dataclass(frozen=True)
class Config:
    num_groups: int
    learning_rate: float
    momentum: float

    def dominates(self, other: "Config") -> bool:
        """True if `other` is at least as aggressive as this in every setting."""
        return (
            other.num_groups >= self.num_groups
            and other.learning_rate >= self.learning_rate * (1 - 1e-9)
            and other.momentum >= self.momentum - 1e-9
        )


@dataclass(frozen=True)
class Outcome:
    # Predicted seconds to the target loss, from the phase's common snapshot; inf when the
    # loss does not fall.
    time_to_target: float
    diverged: bool = False
    # Stopped early as hopeless: never the best, whatever its time.
    pruned: bool = False

    @property
    def usable(self) -> bool:
        return not (self.diverged or self.pruned) and math.isfinite(self.time_to_target)


def rank(config: Config, outcome: Outcome) -> tuple[float, int, float, float]:
    """The one order of configurations, everywhere: least time to target, then the safer
    of equals (fewer groups, smaller learning rate, less momentum)."""
    return (outcome.time_to_target, config.num_groups, config.learning_rate, config.momentum)


Phase = Generator[Config, Outcome, Config | None]


class OmnivoreSearch:
    """The prototype's staged grid search over groups, momentum and learning rate.

    Args:
        num_workers: Worker processes (devices); the numbers of groups tried divide it.
        compiled: The configuration the model was compiled with: phase 0 tries it first.
        learning_rates: The cold start's learning rates.
        momenta: The explicit momenta tried at each number of groups.
        compensated: The server compensates asynchrony: momenta are totals, and each
            phase searches around the compensated configuration.
        momentum_form: How the optimizer's momentum-like setting enters its update
            (`optimizers.MomentumForm`): "heavy ball" (SGD's momentum) keeps the effective
            step `learning_rate / (1 - momentum)` when the momentum changes, "average"
            (Adam's `beta_1`) keeps the learning rate, and "none" (Adagrad) tunes the
            learning rate and groups only.

    Example:

    >>> search = OmnivoreSearch(1, Config(1, 0.01, 0.9))
    >>> next(search.phase(0, start_groups=1))
    Config(num_groups=1, learning_rate=0.01, momentum=0.9)
    """

    def __init__(
        self,
        num_workers: int,
        compiled: Config,
        learning_rates: tuple[float, ...] = (0.1, 0.01, 0.001, 0.0001),
        momenta: tuple[float, ...] = (0.0, 0.3, 0.6, 0.9),
        compensated: bool = False,
        momentum_form: MomentumForm = "heavy ball",
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.num_workers = num_workers
        self.compiled = compiled
        self.learning_rates = tuple(sorted(learning_rates, reverse=True))
        self.momenta = tuple(sorted(momenta)) if momentum_form != "none" else (compiled.momentum,)
        self.momentum_form = momentum_form
        self.compensated = compensated
        self.results: dict[Config, Outcome] = {}
        self._max_trials: int | None = None
        self._trials = 0
        self._incumbent: Config | None = None
        # The relative difference between the incumbent's two trials.
        self._spread = 0.0

    def phase(
        self, index: int, start_groups: int, current: Config | None = None, max_trials: int | None = None
    ) -> Phase:
        """The configurations of one tuning phase; returns the best one, or None when
        none was usable (every one diverged, was pruned, or made no progress).

        Args:
            index: The phase's number; 0 is the cold start (unless `current` is given,
                as when a study of the same model already chose).
            start_groups: The most asynchronous number of groups worth having, measured
                by the caller.
            current: The configuration training runs with, searched around.
            max_trials: The most trials this phase may take; None sets no limit.
        """
        self.results = {}
        self._max_trials = max_trials
        self._trials, self._incumbent, self._spread = 0, None, 0.0
        groups = self._divisor_at_most(start_groups)
        cold = index == 0 and current is None
        # With one group compensation changes nothing: the prototype's search is exact.
        if self.trials_continue(groups, cold):
            assert current is not None
            yield from self._around(current)
            return self.best()
        if self.compensated and groups > 1:
            return Config(groups, self.compiled.learning_rate, self.compiled.momentum)
        if cold:
            yield from self._try_incumbent(self.compiled)
            # What asynchrony's momentum suggests comes before the synchronous sweep: a
            # short budget keeps these, the most promising where more groups pay.
            for momentum in self._momenta_by_promise(groups) if groups > 1 else ():
                yield from self._try(Config(groups, self.compiled.learning_rate, momentum))
            best_lr = yield from self._cold_start()
            learning_rates = (best_lr, best_lr / 10)
        else:
            assert current is not None
            learning_rates = (current.learning_rate, current.learning_rate / 10)
            yield from self._try_incumbent(current)
        yield from self._groups_and_momentum(groups, learning_rates)
        return self.best()

    def trials_continue(self, start_groups: int, cold_start: bool) -> bool:
        """Whether the phase's trials continue from one another (the compensated search
        after the cold start) instead of each starting from the phase's snapshot."""
        return self.compensated and not cold_start and self._divisor_at_most(start_groups) > 1

    def planned_trials(self, start_groups: int, cold_start: bool) -> int:
        """About how many trials a phase takes, the budget's unit: the cold start's, one
        momentum grid with refinement, and one halving of the groups."""
        if self.compensated and self._divisor_at_most(start_groups) > 1:
            # None in the cold start; later a larger learning rate and one momentum (the
            # other is often out of range), each between two trials of the incumbent.
            return 0 if cold_start else 5
        grid = len(self.momenta) * 2 + 2
        halvings = 1 if self._divisor_at_most(start_groups) > 1 else 0
        return (2 + len(self.learning_rates) + 2 if cold_start else 2) + grid * (1 + halvings)

    def best(self) -> Config | None:
        """The best configuration of the phase so far, where it beats the incumbent by
        more than the spread; else the incumbent, when usable."""
        usable = {c: o for c, o in self.results.items() if o.usable}
        if not usable:
            return None
        best = min(usable, key=lambda c: rank(c, usable[c]))
        kept = self._incumbent
        if kept in usable and best != kept:
            margin = max(KEEP_MARGIN, self._spread)
            if usable[best].time_to_target > usable[kept].time_to_target * (1 - margin):
                return kept
        return best

    def _try_incumbent(self, config: Config) -> Generator[Config, Outcome, None]:
        """Tries the incumbent twice: the second trial measures the spread between two of
        the same, and the better of the two counts."""
        yield from self._try(config)
        first = self.results.get(config)
        if first is None:
            return
        self._incumbent = config
        if not first.usable or self._budget_spent():
            return
        self._trials += 1
        second = yield config
        if second.usable:
            self._spread = abs(first.time_to_target - second.time_to_target) / min(first.time_to_target, second.time_to_target)
            self.results[config] = min(first, second, key=lambda outcome: outcome.time_to_target)

    def _around(self, incumbent: Config) -> Generator[Config, Outcome, None]:
        """The compensated search: few candidates, so that each trial is long enough to
        tell them apart, each between two trials of the incumbent. Its learning rate half
        a decade up, then the best's momentum half a grid step either way at the same
        effective step.

        Nothing with a smaller effective step is tried: the step guard brings the step
        down where it is unstable, and a short trial favours a small step (its loss
        settles sooner, to a level that a longer run would have left behind)."""
        self._trials += 1
        first = yield incumbent
        self.results[incumbent] = first
        if not first.usable:
            return
        self._incumbent = incumbent
        times = [first.time_to_target]
        groups = incumbent.num_groups
        yield from self._between_incumbents(Config(groups, incumbent.learning_rate * math.sqrt(10), incumbent.momentum), times)
        best = self._best_at(groups)
        if best is None:
            return
        for momentum in self._momentum_neighbours(best.momentum):
            learning_rate = best.learning_rate
            if self.momentum_form == "heavy ball":
                # The learning rate that keeps the effective step, learning_rate / (1 - momentum).
                learning_rate *= (1 - momentum) / (1 - best.momentum)
            yield from self._between_incumbents(Config(groups, learning_rate, momentum), times)

    def _between_incumbents(self, candidate: Config, times: list[float]) -> Generator[Config, Outcome, None]:
        """Runs `candidate`, then the incumbent again (`times` holds the incumbent's
        times so far); the candidate's time counts relative to the geometric mean of the
        incumbent's either side of it, in units of the incumbent's first."""
        assert self._incumbent is not None
        # A candidate without the incumbent's trial after it would be judged on one side.
        room = self._max_trials is None or self._trials + 2 <= self._max_trials
        if not room or self._tried_or_hopeless(candidate):
            return
        self._trials += 2
        measured = yield candidate
        again = yield self._incumbent
        if not again.usable:
            # The incumbent no longer trains: nothing to score the candidate against.
            self.results[candidate] = Outcome(math.inf, pruned=True)
            return
        before = times[-1]
        times.append(again.time_to_target)
        self._spread = _spread_of(times)
        if measured.usable:
            # Against the geometric mean: exact where each trial's time grows by one factor.
            measured = Outcome(measured.time_to_target * times[0] / math.sqrt(before * again.time_to_target))
        self.results[candidate] = measured

    def _cold_start(self) -> Generator[Config, Outcome, float]:
        momentum = self.momenta[-1]
        # Decades from the compiled rate; ties go to the larger rate, as in the grid.
        nearest_first = sorted(self.learning_rates, key=lambda lr: round(abs(math.log10(lr / self.compiled.learning_rate)), 6))
        for lr in nearest_first:
            yield from self._try(Config(1, lr, momentum))
        low, high = self.learning_rates[-1], self.learning_rates[0]
        # Widen the range (twice at most) while the best learning rate sits on its edge.
        for _ in range(2):
            best = self._best_learning_rate()
            if best == high:
                high *= 10
                yield from self._try(Config(1, high, momentum))
            elif best == low:
                low /= 10
                yield from self._try(Config(1, low, momentum))
            else:
                break
        # Decades are coarse: the best's neighbours at a factor of sqrt(10) too.
        best = self._best_learning_rate()
        for lr in (best * math.sqrt(10), best / math.sqrt(10)):
            yield from self._try(Config(1, lr, momentum))
        return self._best_learning_rate()

    def _groups_and_momentum(self, groups: int, learning_rates: tuple[float, ...]) -> Generator[Config, Outcome, None]:
        while True:
            for momentum in self._momenta_by_promise(groups):
                for lr in learning_rates:
                    yield from self._try(Config(groups, lr, momentum))
            best = self._best_at(groups)
            if groups == 1 or best is None or best.momentum > 0:
                break
            # Asynchrony alone brings more momentum than is best: fewer groups.
            groups = self._divisor_at_most(groups // 2)
        if best is not None:
            yield from self._refine_momentum(best)

    def _refine_momentum(self, best: Config) -> Generator[Config, Outcome, None]:
        """The best's momentum half a grid step either way."""
        for momentum in self._momentum_neighbours(best.momentum):
            yield from self._try(Config(best.num_groups, best.learning_rate, momentum))

    def _momentum_neighbours(self, momentum: float) -> list[float]:
        """The momenta half a grid step either way that lie in [0, 1)."""
        if len(self.momenta) == 1:
            return []
        step = (self.momenta[-1] - self.momenta[0]) / (len(self.momenta) - 1) / 2
        return [round(m, 6) for m in (momentum - step, momentum + step) if 0 <= m < 1]

    def _momenta_by_promise(self, groups: int) -> list[float]:
        """The grid's momenta, those that bring the total (with asynchrony's 1 - 1/g)
        nearest the usual 0.9 first."""
        return sorted(self.momenta, key=lambda m: (abs(m + implicit_momentum(groups) - 0.9), -m))

    def _try(self, config: Config) -> Generator[Config, Outcome, None]:
        if self._budget_spent() or self._tried_or_hopeless(config):
            return
        self._trials += 1
        self.results[config] = yield config

    def _tried_or_hopeless(self, config: Config) -> bool:
        """Tried already, or at least as aggressive as one that diverged."""
        return config in self.results or any(o.diverged and c.dominates(config) for c, o in self.results.items())

    def _budget_spent(self) -> bool:
        return self._max_trials is not None and self._trials >= self._max_trials

    def _best_at(self, groups: int) -> Config | None:
        usable = {c: o for c, o in self.results.items() if c.num_groups == groups and o.usable}
        return min(usable, key=lambda c: rank(c, usable[c])) if usable else None

    def _best_learning_rate(self) -> float:
        usable = {c: o for c, o in self.results.items() if c.num_groups == 1 and o.usable}
        if not usable:
            # Nothing usable yet: stay with what the model was compiled with.
            return self.compiled.learning_rate
        return min(usable, key=lambda c: rank(c, usable[c])).learning_rate

    def _divisor_at_most(self, groups: int) -> int:
        return max(g for g in range(1, max(groups, 1) + 1) if self.num_workers % g == 0)


def _spread_of(times: list[float]) -> float:
    """How far the incumbent's continuing trials differ by chance: with three or more, the
    most a trial lies from the geometric mean of those either side of it (which the
    loss's slowing does not move); with two, their whole difference."""
    if len(times) < 3:
        ratios = [times[-1] / times[0]]
    else:
        ratios = [times[k] / math.sqrt(times[k - 1] * times[k + 1]) for k in range(1, len(times) - 1)]
    return max(max(ratio, 1 / ratio) - 1 for ratio in ratios)
