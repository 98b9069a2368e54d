"""The search against synthetic objectives whose optimum is known."""

import math

import pytest

from omnikeras.tuner.search import Config, OmnivoreSearch, Outcome, rank

COMPILED = Config(1, 0.01, 0.9)


def _run(
    search: OmnivoreSearch, objective, phase: int = 0, start_groups: int = 1, current: Config | None = None, max_trials: int | None = None
) -> tuple[Config | None, list[Config]]:
    tried = []
    generator = search.phase(phase, start_groups, current, max_trials)
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
    chosen, tried = _run(OmnivoreSearch(4, COMPILED), _bowl(optimum, {1: 1.0, 2: 0.55, 4: 0.54}), start_groups=4)
    assert chosen == optimum
    # The compiled settings first, twice (the spread between two trials of one); then,
    # where more groups pay, the momenta at 4 groups that bring the total nearest 0.9
    # (asynchrony gives 0.75); then the cold start, synchronous with momentum 0.9, nearest
    # learning rate first, then the best's neighbours half a decade away.
    assert tried[:6] == [COMPILED, COMPILED] + [Config(4, 0.01, m) for m in (0.3, 0.0, 0.6, 0.9)]
    assert tried[6:10] == [Config(1, lr, 0.9) for lr in (0.1, 0.001, 0.0001)] + [Config(1, 0.01 * 10**0.5, 0.9)]


def test_every_momentum_of_the_grid_at_every_number_of_groups_then_refined() -> None:
    optimum = Config(num_groups=4, learning_rate=0.01, momentum=0.6)
    _, tried = _run(OmnivoreSearch(4, COMPILED), _bowl(optimum, {1: 1.0, 2: 0.6, 4: 0.4}), start_groups=4)
    at_four = [c for c in tried if c.num_groups == 4]
    # The whole grid, although asynchrony's momentum at 4 groups is 0.75 already.
    assert {c.momentum for c in at_four} >= {0.0, 0.3, 0.6, 0.9}
    assert {0.45, 0.75} <= {c.momentum for c in at_four if c.learning_rate == 0.01}


def test_halves_the_groups_while_the_best_momentum_is_zero() -> None:
    optimum = Config(num_groups=1, learning_rate=0.001, momentum=0.6)
    chosen, tried = _run(OmnivoreSearch(4, Config(1, 0.001, 0.9)), _bowl(optimum, {1: 1.0, 2: 1.2, 4: 1.3}), start_groups=4)
    assert chosen == optimum
    assert [c.num_groups for c in tried if c.num_groups > 1][:8] == [4] * 8
    assert 2 in {c.num_groups for c in tried}


def test_widens_the_learning_rates_at_the_edge() -> None:
    optimum = Config(num_groups=1, learning_rate=10.0, momentum=0.9)
    _, tried = _run(OmnivoreSearch(1, Config(1, 0.1, 0.9)), _bowl(optimum, {1: 1.0}))
    assert [c.learning_rate for c in tried[:7]] == pytest.approx([0.1, 0.1, 0.01, 0.001, 0.0001, 1.0, 10.0])


def test_settings_beyond_a_diverged_one_are_skipped() -> None:
    def objective(config: Config) -> Outcome:
        if config.learning_rate >= 0.1:
            return Outcome(math.inf, diverged=True)
        return Outcome(1 / config.learning_rate + 10 * config.num_groups)

    _, tried = _run(OmnivoreSearch(4, COMPILED), objective, start_groups=4)
    assert Config(1, 0.1, 0.9) in tried
    assert not any(c.learning_rate >= 1.0 for c in tried), "no widening past a divergence"
    assert not any(c.learning_rate >= 0.1 and c.num_groups > 1 for c in tried)


def test_a_pruned_or_diverged_trial_never_wins() -> None:
    def objective(config: Config) -> Outcome:
        if config.momentum == 0.3:
            return Outcome(1.0, pruned=True)  # the fastest of all, but pruned
        if config.momentum == 0.0:
            return Outcome(0.5, diverged=True)
        return Outcome(10.0 + config.learning_rate)

    chosen, _ = _run(OmnivoreSearch(1, COMPILED), objective)
    assert chosen is not None and chosen.momentum not in (0.0, 0.3)


def test_ties_keep_the_incumbent_and_otherwise_go_to_the_safer_configuration() -> None:
    chosen, tried = _run(OmnivoreSearch(2, COMPILED), lambda config: Outcome(5.0), start_groups=2)
    assert chosen == COMPILED
    assert rank(Config(1, 0.01, 0.3), Outcome(5.0)) < rank(Config(2, 0.001, 0.0), Outcome(5.0))


def test_the_incumbent_is_kept_unless_beaten_by_more_than_the_spread_of_its_own_trials() -> None:
    better = Config(1, 0.1, 0.9)

    def objective(times: list[float], candidate: float):
        def run(config: Config) -> Outcome:
            return Outcome(times.pop(0) if config == COMPILED else candidate if config == better else 100.0)

        return run

    # Its two trials agree: a candidate 15% faster wins, one 5% faster does not.
    assert _run(OmnivoreSearch(1, COMPILED), objective([10.0, 10.0], 8.5))[0] == better
    assert _run(OmnivoreSearch(1, COMPILED), objective([10.0, 10.0], 9.5))[0] == COMPILED
    # They differ by 50%: so must a candidate, from the better of the two.
    assert _run(OmnivoreSearch(1, COMPILED), objective([10.0, 15.0], 6.0))[0] == COMPILED
    assert _run(OmnivoreSearch(1, COMPILED), objective([10.0, 15.0], 4.0))[0] == better


def test_later_phases_search_around_the_current_configuration() -> None:
    current = Config(num_groups=2, learning_rate=0.01, momentum=0.3)
    chosen, tried = _run(
        OmnivoreSearch(4, COMPILED), _bowl(Config(2, 0.001, 0.3), {1: 1.0, 2: 0.5, 4: 0.45}), phase=1, start_groups=2, current=current
    )
    assert tried[0] == current
    assert {c.learning_rate for c in tried} == {0.01, 0.001}
    assert chosen == Config(2, 0.001, 0.3)


def test_a_short_budget_drops_the_least_promising_candidates() -> None:
    _, all_tried = _run(OmnivoreSearch(1, COMPILED), _bowl(Config(1, 0.01, 0.6), {1: 1.0}))
    chosen, tried = _run(OmnivoreSearch(1, COMPILED), _bowl(Config(1, 0.01, 0.6), {1: 1.0}), max_trials=6)
    assert len(tried) == 6 < len(all_tried)
    # What stays: the compiled settings (twice) and the learning rates nearest them.
    assert tried[:4] == [COMPILED, COMPILED, Config(1, 0.1, 0.9), Config(1, 0.001, 0.9)]
    assert chosen in tried
    assert OmnivoreSearch(1, COMPILED).planned_trials(1, cold_start=True) >= len(all_tried) - 4


def test_nothing_usable_returns_none() -> None:
    chosen, _ = _run(OmnivoreSearch(2, COMPILED), lambda config: Outcome(math.inf, diverged=True), start_groups=2)
    assert chosen is None


def _compensated_bowl(best: Config, hardware: dict[int, float]):
    """Time to target with compensated asynchrony: the momentum is the total, whatever
    the groups, and each group's update is worth as much as a synchronous one."""

    def objective(config: Config) -> Outcome:
        updates = 100 * (1 + math.log10(config.learning_rate / best.learning_rate) ** 2 + 10 * (config.momentum - best.momentum) ** 2)
        return Outcome(hardware[config.num_groups] * updates)

    return objective


def test_compensated_cold_start_chooses_the_compiled_settings_at_the_groups_worth_having() -> None:
    compiled = Config(2, 0.01, 0.9)
    search = OmnivoreSearch(4, compiled, compensated=True)
    assert _run_without_trials(search, start_groups=4) == Config(4, 0.01, 0.9)
    assert search.planned_trials(4, cold_start=True) == 0
    # With one group compensation changes nothing: the prototype's cold start.
    _, tried = _run(OmnivoreSearch(3, COMPILED, compensated=True), _compensated_bowl(COMPILED, {1: 1.0}), start_groups=2)
    assert tried[2:5] == [Config(1, lr, 0.9) for lr in (0.1, 0.001, 0.0001)]


def _run_without_trials(search: OmnivoreSearch, start_groups: int) -> Config | None:
    with pytest.raises(StopIteration) as done:
        next(search.phase(0, start_groups))
    return done.value.value


def test_compensated_later_phases_raise_the_learning_rate_then_move_the_momentum_at_the_same_step() -> None:
    current = Config(4, 0.01, 0.9)
    half_decade = 10**0.5
    optimum = Config(4, 0.01 * half_decade * 2.5, 0.75)  # the step of 0.01 * half_decade / 0.1
    search = OmnivoreSearch(4, COMPILED, compensated=True)

    def objective(config: Config) -> Outcome:
        step, best_step = config.learning_rate / (1 - config.momentum), optimum.learning_rate / (1 - optimum.momentum)
        return Outcome(100 * (1 + math.log10(step / best_step) ** 2 + 10 * (config.momentum - optimum.momentum) ** 2))

    chosen, tried = _run(search, objective, phase=1, start_groups=4, current=current)
    assert chosen == Config(4, pytest.approx(optimum.learning_rate), 0.75)
    # Its learning rate half a decade up (never down: a short trial favours the smaller
    # step), then the best's momentum half a grid step down at the same effective step
    # (up is out of range), each between two trials of the incumbent.
    assert tried[:3] == [current, Config(4, 0.01 * half_decade, 0.9), current]
    assert tried[3].momentum == 0.75 and tried[3].learning_rate == pytest.approx(optimum.learning_rate)
    assert tried[4] == current
    assert search.planned_trials(4, cold_start=False) == len(tried)
    assert search.trials_continue(4, cold_start=False)
    assert not search.trials_continue(4, cold_start=True) and not OmnivoreSearch(4, COMPILED).trials_continue(4, False)


def test_continuing_trials_score_each_candidate_against_the_incumbent_either_side_of_it() -> None:
    """Trials that continue from one another see the loss slow as training goes on: each
    trial's time to target grows with its place in the sequence, here by 30% a trial."""
    current = Config(4, 0.01, 0.9)

    def run_with(candidate_time: float, max_trials: int | None = None):
        place = 0

        def objective(config: Config) -> Outcome:
            nonlocal place
            place += 1
            return Outcome((100.0 if config == current else candidate_time) * 1.3 ** place)

        search = OmnivoreSearch(4, COMPILED, compensated=True)
        return _run(search, objective, phase=1, start_groups=4, current=current, max_trials=max_trials)

    # A candidate as good as the incumbent does not win for coming first, nor lose for
    # coming later; one clearly better wins wherever it comes.
    chosen, tried = run_with(100.0)
    assert chosen == current and tried[::2] == [current] * 3
    assert run_with(60.0)[0] != current
    # Where the budget leaves no room for the incumbent after a candidate, the candidate is not tried.
    assert run_with(60.0, max_trials=4)[1] == [current, Config(4, 0.01 * 10**0.5, 0.9), current]


def test_compensated_search_keeps_the_groups_where_the_best_momentum_is_low() -> None:
    # Uncompensated, a best momentum of 0 at 4 groups halves them; compensated it is a
    # total, refined in later phases at the same groups.
    current = Config(4, 0.01, 0.3)
    chosen, tried = _run(
        OmnivoreSearch(4, COMPILED, compensated=True),
        _compensated_bowl(Config(4, 0.01, 0.15), {1: 1.0, 2: 0.6, 4: 0.4}),
        phase=1, start_groups=4, current=current,
    )
    assert chosen is not None and chosen.momentum == 0.15
    assert {c.num_groups for c in tried} == {4}


def test_compensated_later_phases_keep_the_current_configuration_where_nothing_beats_it() -> None:
    current = Config(4, 0.01, 0.9)
    chosen, tried = _run(
        OmnivoreSearch(4, COMPILED, compensated=True), _compensated_bowl(current, {1: 1.0, 2: 0.6, 4: 0.4}),
        phase=1, start_groups=4, current=current,
    )
    assert chosen == current
    assert {c.num_groups for c in tried} == {4}


def test_without_a_momentum_like_setting_only_groups_and_learning_rates_are_tried() -> None:
    compiled = Config(1, 0.01, 0.0)
    optimum = Config(num_groups=2, learning_rate=0.01, momentum=0.0)
    chosen, tried = _run(OmnivoreSearch(4, compiled, momentum_form="none"), _bowl(optimum, {1: 1.0, 2: 0.55, 4: 0.54}), start_groups=4)
    assert {c.momentum for c in tried} == {0.0}
    assert {c.num_groups for c in tried} > {1} and chosen is not None and chosen.momentum == 0.0


def test_a_moving_average_momentum_moves_at_the_same_learning_rate() -> None:
    current = Config(4, 0.001, 0.9)
    search = OmnivoreSearch(4, Config(1, 0.001, 0.9), compensated=True, momentum_form="average")
    _, tried = _run(search, lambda config: Outcome(100.0 + config.momentum), phase=1, start_groups=4, current=current)
    moved = [c for c in tried if c.momentum != 0.9]
    # Adam's effective step is its learning rate: a new beta_1 keeps it.
    assert moved and all(c.learning_rate == current.learning_rate for c in moved)
