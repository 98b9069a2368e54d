"""The search against synthetic objectives whose optimum is known."""

import math

import pytest

from omnikeras.tuner.search import Config, OmnivoreSearch, Outcome


def _run(search: OmnivoreSearch, objective, phase: int = 0, current: Config | None = None) -> tuple[Config, list[Config]]:
    tried = []
    generator = search.phase(phase, current)
    config = next(generator)
    while True:
        tried.append(config)
        try:
            config = generator.send(objective(config))
        except StopIteration as done:
            return done.value, tried


def _bowl(best: Config, hardware: dict[int, float]):
    """Time to target: seconds per update by groups x updates growing away from the best
    learning rate and total momentum (explicit plus asynchrony's 1 - 1/g)."""
    best_total = best.momentum + 1 - 1 / best.num_groups

    def objective(config: Config) -> Outcome:
        total = config.momentum + 1 - 1 / config.num_groups
        updates = 100 * (1 + math.log10(config.learning_rate / best.learning_rate) ** 2 + 10 * (total - best_total) ** 2)
        return Outcome(hardware[config.num_groups] * updates)

    return objective


def test_finds_the_known_optimum() -> None:
    optimum = Config(num_groups=2, learning_rate=0.01, momentum=0.3)
    chosen, tried = _run(OmnivoreSearch(4), _bowl(optimum, {1: 1.0, 2: 0.55, 4: 0.54}))
    assert chosen == optimum
    # The cold start came first, synchronous with momentum 0.9, then the best learning
    # rate's neighbours half a decade away.
    assert tried[:4] == [Config(1, lr, 0.9) for lr in (0.1, 0.01, 0.001, 0.0001)]
    assert [c.learning_rate for c in tried[4:6]] == pytest.approx([0.01 * 10**0.5, 0.01 / 10**0.5])


def test_halves_the_groups_while_the_best_momentum_is_zero() -> None:
    optimum = Config(num_groups=1, learning_rate=0.001, momentum=0.6)
    chosen, tried = _run(OmnivoreSearch(4), _bowl(optimum, {1: 1.0, 2: 0.95, 4: 0.9}))
    assert chosen == optimum
    assert [c.num_groups for c in tried if c.num_groups > 1] == [4, 4, 2, 2, 2, 2]


def test_widens_the_learning_rates_at_the_edge() -> None:
    optimum = Config(num_groups=1, learning_rate=10.0, momentum=0.9)
    _, tried = _run(OmnivoreSearch(1), _bowl(optimum, {1: 1.0}))
    assert [c.learning_rate for c in tried[:6]] == pytest.approx([0.1, 0.01, 0.001, 0.0001, 1.0, 10.0])


def test_settings_beyond_a_diverged_one_are_skipped() -> None:
    def objective(config: Config) -> Outcome:
        if config.learning_rate >= 0.1:
            return Outcome(math.inf, diverged=True)
        return Outcome(1 / config.learning_rate + 10 * config.num_groups)

    search = OmnivoreSearch(4)
    _, tried = _run(search, objective)
    assert Config(1, 0.1, 0.9) in tried
    assert not any(c.learning_rate >= 1.0 for c in tried), "no widening past a divergence"
    assert not any(c.learning_rate >= 0.1 and c.num_groups > 1 for c in tried)


def test_later_phases_search_around_the_current_configuration() -> None:
    current = Config(num_groups=2, learning_rate=0.01, momentum=0.3)
    chosen, tried = _run(OmnivoreSearch(4), _bowl(Config(2, 0.001, 0.3), {1: 1.0, 2: 0.5, 4: 0.45}), phase=1, current=current)
    assert {c.learning_rate for c in tried} == {0.01, 0.001}
    assert chosen == Config(2, 0.001, 0.3)


def test_everything_diverging_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="try smaller"):
        _run(OmnivoreSearch(2), lambda config: Outcome(math.inf, diverged=True))
