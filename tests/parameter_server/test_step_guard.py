"""The step guard on synthetic loss curves and gradient sizes: warm-up, halving where the
loss climbs or a gradient spikes, and no halving on noise."""

import numpy as np
import pytest

from omnikeras.parameter_server.step_guard import BACKOFF, GROWTH, HOLD, SPIKE, StepGuard


def _run(guard: StepGuard, losses: "list[float | None] | np.ndarray", step: float = 1.0) -> list[float]:
    steps = []
    for loss in losses:
        steps.append(guard.cap(step))
        guard.record(None if loss is None else float(loss))
    return steps


def test_the_cap_warms_up_to_the_compiled_step_and_no_further() -> None:
    guard = StepGuard(start=0.125)
    steps = _run(guard, [None] * 300)
    assert steps[0] == 0.125
    assert steps[1] == pytest.approx(0.125 * GROWTH)
    assert steps[-1] == 1.0


def test_noisy_falling_losses_never_halve_the_step() -> None:
    rng = np.random.default_rng(0)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        updates = np.arange(3000)
        # A loss that falls from 2.3 towards 0.05, each batch's within a factor of about 2.
        losses = (0.05 + 2.25 * np.exp(-updates / 500)) * rng.lognormal(0, 0.35, len(updates))
        guard = StepGuard(start=0.25)
        _run(guard, losses)
        assert guard.backoffs == 0


def test_the_cap_grows_on_a_flat_noisy_loss_that_sets_no_new_best() -> None:
    # A small step lowers the loss too slowly for new bests to stand out of its noise.
    for seed in range(5):
        rng = np.random.default_rng(seed)
        guard = StepGuard(start=1 / 38)
        steps = _run(guard, 0.3 * rng.lognormal(0, 0.35, 1000))
        assert guard.backoffs == 0
        assert steps[-1] == 1.0


def test_a_loss_that_climbs_halves_the_step_holds_it_and_warms_up_slower() -> None:
    guard = StepGuard(start=1.0)
    _run(guard, [1.0] * 100)
    steps = _run(guard, [1.0 * 1.3**k for k in range(10)] + [1.0] * (HOLD + 50))
    assert guard.backoffs == 1
    halved = steps.index(BACKOFF)
    # Held for HOLD updates, then warming up at half the pace.
    assert steps[halved : halved + HOLD] == [BACKOFF] * HOLD
    assert steps[halved + HOLD + 1] == pytest.approx(BACKOFF * (1 + (GROWTH - 1) / 2))


def test_the_cap_follows_the_compiled_step_down_and_warms_up_when_it_rises() -> None:
    guard = StepGuard(start=0.25)
    _run(guard, [None] * 10, step=1.0)
    assert _run(guard, [None] * 10, step=0.1)[-1] == 0.1
    # From the start's share of the raised step, above where the cap had come down to.
    rising = _run(guard, [None] * 10, step=1.0)
    assert rising[0] == pytest.approx(0.25)
    assert rising[-1] == pytest.approx(0.25 * GROWTH**9)


def test_a_compiled_step_that_warms_up_from_zero_raises_the_cap_with_it() -> None:
    # A schedule's warm-up from 0 (keras-io's warm-up cosine, CosineDecay's warmup_target):
    # a cap grown from 0 would stay at 0.
    guard = StepGuard(start=0.25)
    steps = []
    for k in range(100):
        steps.append(guard.cap(k / 100))
        guard.record(None)
    assert steps[0] == 0.0
    assert all(0.25 * k / 100 <= step <= k / 100 for k, step in enumerate(steps))
    # Grown to the schedule's, an update behind it: the cap grows no further than the
    # compiled step it last applied.
    assert steps[-1] == pytest.approx(0.98)


def test_after_a_halving_the_cap_stays_below_the_start_s_share_where_the_loss_put_it() -> None:
    guard = StepGuard(start=1.0)
    _run(guard, [1.0] * 100)
    _run(guard, [1.0 * 1.3**k for k in range(10)])
    assert guard.backoffs == 1
    assert _run(guard, [1.0], step=1.0) == [BACKOFF]


def test_a_restart_measures_the_loss_level_afresh() -> None:
    guard = StepGuard(start=1.0)
    _run(guard, [0.1] * 200)
    # Restored weights train from a loss far above the level reached: not a climb.
    guard.restart()
    _run(guard, [2.0] * 50)
    assert guard.backoffs == 0


def _admit(guard: StepGuard, magnitudes: "list[float] | np.ndarray", step: float = 1.0) -> list[float]:
    """The shares of gradients of `magnitudes` applied, one update each, with a steady loss."""
    shares = []
    for magnitude in magnitudes:
        guard.cap(step)
        shares.append(guard.share(float(magnitude)))
        guard.record(1.0)
    return shares


def test_a_gradient_that_spikes_is_applied_at_the_usual_size_and_halves_the_step() -> None:
    guard = StepGuard(start=1.0)
    _admit(guard, [10.0] * 100)
    shares = _admit(guard, [100.0, 300.0, 10.0])
    # Cut to SPIKE times the usual 10, and the step halved once for the throw.
    assert shares[0] == pytest.approx(SPIKE * 10.0 / 100.0)
    assert shares[1] < shares[0]
    assert shares[2] == 1.0
    assert guard.backoffs == 1
    assert guard.cap(1.0) == BACKOFF


def test_noisy_gradient_magnitudes_never_halve_the_step() -> None:
    for seed in range(5):
        rng = np.random.default_rng(seed)
        # Magnitudes that grow tenfold over training, each within a factor of about 2.
        magnitudes = np.geomspace(10, 100, 3000) * rng.lognormal(0, 0.3, 3000)
        guard = StepGuard(start=0.25)
        assert min(_admit(guard, magnitudes)) == 1.0
        assert guard.backoffs == 0
