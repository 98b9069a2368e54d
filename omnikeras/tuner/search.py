"""Which configurations to try: the Omnivore prototype's search, phase by phase.

Phase 0 (cold start): synchronous (g = 1) with momentum 0.9 and learning rates from 0.1
down to 0.0001; if the best sits on the edge of that range, the range widens, and the
best's neighbours half a decade away are tried too. Then the
most asynchronous g before hardware efficiency saturates, with momentum {0, 0.3, 0.6,
0.9} x learning rate {best, best / 10}, the momenta limited to those that asynchrony's own
momentum (1 - 1/g) does not already push past the ceiling; while the best momentum at g is
0, asynchrony gives too much momentum by itself and g halves.

Later phases search again around the current configuration, with its learning rate and
its tenth. A configuration more aggressive (as many groups or more, as large a learning
rate or larger, as much momentum or more) than one that diverged is skipped. Each phase
ends with the configuration of least predicted time to target among those it tried.

The search only decides; its caller runs each configuration and sends back the outcome:

    phase = search.phase(0)
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
    # Predicted seconds to the target loss; inf when the loss does not fall.
    time_to_target: float
    diverged: bool = False


Phase = Generator[Config, Outcome, Config]


class OmnivoreSearch:
    """The prototype's staged grid search over groups, momentum and learning rate.

    Args:
        num_workers: Worker processes; the numbers of groups tried divide it.
        max_groups: The most groups worth trying (where hardware efficiency saturates);
            None (the default) allows `num_workers`.
        learning_rates: The cold start's learning rates.
        momenta: The explicit momenta tried at each number of groups.
        momentum_ceiling: No explicit momentum is tried whose sum with asynchrony's
            implicit momentum exceeds this. Defaults to 0.95.
    """

    def __init__(
        self,
        num_workers: int,
        max_groups: int | None = None,
        learning_rates: tuple[float, ...] = (0.1, 0.01, 0.001, 0.0001),
        momenta: tuple[float, ...] = (0.0, 0.3, 0.6, 0.9),
        momentum_ceiling: float = 0.95,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.num_workers = num_workers
        self.max_groups = min(max_groups or num_workers, num_workers)
        self.learning_rates = tuple(sorted(learning_rates, reverse=True))
        self.momenta = tuple(sorted(momenta))
        self.momentum_ceiling = momentum_ceiling
        self.results: dict[Config, Outcome] = {}

    def phase(self, index: int, current: Config | None = None) -> Phase:
        """The configurations of one tuning phase; returns the chosen one."""
        self.results = {}
        if index == 0 or current is None:
            best_lr = yield from self._cold_start()
            groups = self._divisor_at_most(self.max_groups)
            learning_rates = (best_lr, best_lr / 10)
        else:
            groups = current.num_groups
            learning_rates = (current.learning_rate, current.learning_rate / 10)
        yield from self._groups_and_momentum(groups, learning_rates)
        return self.best()

    def best(self) -> Config:
        finite = {c: o for c, o in self.results.items() if not o.diverged and math.isfinite(o.time_to_target)}
        if not finite:
            raise RuntimeError(
                "every configuration tried diverged or made no progress: try smaller learning rates"
            )
        return min(finite, key=lambda c: (finite[c].time_to_target, c.num_groups))

    def momentum_candidates(self, num_groups: int) -> list[float]:
        ceiling = self.momentum_ceiling - implicit_momentum(num_groups)
        return sorted({0.0, *(m for m in self.momenta if m <= ceiling + 1e-9)})

    def _cold_start(self) -> Generator[Config, Outcome, float]:
        momentum = self.momenta[-1]
        for lr in self.learning_rates:
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
            for momentum in self.momentum_candidates(groups):
                for lr in learning_rates:
                    yield from self._try(Config(groups, lr, momentum))
            at_groups = {c: o for c, o in self.results.items() if c.num_groups == groups and not o.diverged}
            best = min(at_groups, key=lambda c: at_groups[c].time_to_target, default=None)
            if groups == 1 or (best is not None and best.momentum > 0):
                return
            # Asynchrony alone brings more momentum than is best: fewer groups.
            groups = self._divisor_at_most(groups // 2)

    def _try(self, config: Config) -> Generator[Config, Outcome, None]:
        if config in self.results:
            return
        if any(o.diverged and c.dominates(config) for c, o in self.results.items()):
            return
        self.results[config] = yield config

    def _best_learning_rate(self) -> float:
        cold = {c: o for c, o in self.results.items() if c.num_groups == 1 and not o.diverged}
        if not cold:
            raise RuntimeError("every learning rate of the cold start diverged: try smaller ones")
        return min(cold, key=lambda c: cold[c].time_to_target).learning_rate

    def _divisor_at_most(self, groups: int) -> int:
        return max(g for g in range(1, max(groups, 1) + 1) if self.num_workers % g == 0)
