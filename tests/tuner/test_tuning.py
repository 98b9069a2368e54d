"""The tuner's logic against a simulated cluster: phases, trials, budget, the end of fit."""

import collections
import math
import random

import optuna
import pytest

from omnikeras.convergence import MeasuredHardwareModel
from omnikeras.tuner import records
from omnikeras.tuner.records import PhaseRecord, TrialRecord
from omnikeras.tuner.search import Config
from omnikeras.tuner.study import open_study
from omnikeras.tuner.tuning import (
    BEST_SNAPSHOT,
    PHASE_SNAPSHOT,
    REPORT_EVERY,
    TRIAL_SNAPSHOT,
    Step,
    Tuner,
    TuningSettings,
)


class SimulatedCluster:
    """A cluster whose 'weights' are their loss: each update multiplies it by a factor
    that is best at learning rate 0.03 and total momentum 0.9 (explicit plus 1 - 1/g);
    0.1 and above diverges. Time advances by the seconds per update of the groups. One of
    the chief's steps makes one such update's progress; on a compensated cluster, whose
    total momentum is the one set whatever the groups, each group's update makes it, at
    the share of the step that a cap warming up from 5% by `cap_growth` per update allows."""

    def __init__(
        self, devices: int = 1, seconds_per_update: dict[int, float] | None = None, compensated: bool = False, cap_growth: float = 1.01
    ) -> None:
        self.devices = devices
        self.compensated = compensated
        self.cap_growth = cap_growth
        self.seconds_per_update = seconds_per_update or {1: 0.01}
        self.loss, self.version, self.seconds = 2.3, 0, 0.0
        self.learning_rate, self.momentum, self.groups = 0.01, 0.9, 1
        # The loss, and the cap's warm-up, as the server keeps them with a snapshot.
        self.snapshots: dict[str, tuple[float, int]] = {}
        self.restored: list[str] = []
        self.probes = 0
        self.asynchronous_updates = 0

    def save_snapshot(self, name: str) -> None:
        self.snapshots[name] = (self.loss, self.asynchronous_updates)

    def restore_snapshot(self, name: str) -> int:
        self.loss, self.asynchronous_updates = self.snapshots[name]
        self.restored.append(name)
        self.version += 1
        return self.version

    def set_hyperparameters(self, learning_rate: float, momentum: float) -> None:
        self.learning_rate, self.momentum = learning_rate, momentum

    def step_share(self) -> float:
        if not self.compensated or self.groups == 1:
            return 1.0
        return min(1.0, 0.05 * self.cap_growth**self.asynchronous_updates)

    def set_groups(self, num_groups: int) -> None:
        self.groups = num_groups

    def staleness(self) -> collections.Counter[int]:
        return collections.Counter({self.groups - 1: self.version})

    def probe_loss(self) -> float:
        self.probes += 1
        return self.loss

    def train_step(self) -> Step:
        if self.learning_rate >= 0.1:
            self.loss *= 2.0
        else:
            total = self.momentum + (0 if self.compensated else 1 - 1 / self.groups)
            quality = math.exp(-math.log10(self.learning_rate / 0.03) ** 2) * max(0.05, 1 - 3 * abs(total - 0.9))
            progress = (1 - 0.03 * quality * self.step_share()) ** (self.groups if self.compensated else 1)
            self.asynchronous_updates += self.groups if self.groups > 1 else 0
            self.loss = max(0.02, self.loss * progress)
        self.version += self.groups
        self.seconds += self.seconds_per_update[self.groups] * self.groups
        return Step(self.seconds, self.version, self.loss if math.isfinite(self.loss) else math.nan)


def _tuner(cluster: SimulatedCluster, tmp_path, planned_steps: int | None = 3000, storage: str | None = None, said: list | None = None) -> Tuner:
    study = open_study(storage or f"sqlite:///{tmp_path}/study.db", "test", warmup_steps=5)
    settings = TuningSettings(target_loss=0.05, max_trial_steps=20, planned_steps=planned_steps)
    return Tuner(cluster, study, settings, Config(1, 0.01, 0.9), MeasuredHardwareModel(cluster.devices),
                 say=(said if said is not None else []).append, clock=lambda: cluster.seconds, compensated=cluster.compensated)


def _train(tuner: Tuner, cluster: SimulatedCluster, steps: int) -> None:
    for _ in range(steps):
        tuner.step(cluster.train_step())


def test_one_device_tunes_momentum_and_learning_rate_and_carries_on_with_the_best(tmp_path) -> None:
    cluster, said = SimulatedCluster(), []
    tuner = _tuner(cluster, tmp_path, said=said)
    _train(tuner, cluster, 600)
    assert said[0] == "omnivore: one worker process, one device: tuning momentum and learning rate only"
    (phase,) = PhaseRecord.read_all(tuner.study)[:1]
    assert phase.config.num_groups == 1 and phase.seconds_per_update == {}
    assert phase.config.learning_rate == pytest.approx(0.0316, rel=0.01)  # the bowl's best, half a decade up
    assert any(line.startswith("omnivore phase 0: 1 group,") for line in said)
    assert cluster.groups == 1 and cluster.learning_rate == phase.config.learning_rate


def test_a_diverged_trial_never_wins_nor_lends_its_weights(tmp_path) -> None:
    cluster = SimulatedCluster()
    tuner = _tuner(cluster, tmp_path)
    _train(tuner, cluster, 600)
    trials = {records.config_of(t.params): TrialRecord.read(t) for t in tuner.study.trials}
    diverged = [config for config, record in trials.items() if record and record.diverged]
    assert diverged and all(config.learning_rate >= 0.1 for config in diverged)
    assert all(t.state == optuna.trial.TrialState.PRUNED for t in tuner.study.trials if TrialRecord.read(t).diverged)
    chosen = PhaseRecord.read_all(tuner.study)[0].config
    assert chosen not in diverged
    # The weights that carried on are the best trial's, restored from its snapshot.
    assert BEST_SNAPSHOT in cluster.restored


def test_a_blow_up_counts_as_diverged_at_its_first_report_even_where_the_pruner_prunes(tmp_path) -> None:
    cluster = SimulatedCluster()
    tuner = _tuner(cluster, tmp_path)
    tuner.study.pruner = optuna.pruners.ThresholdPruner(upper=0.0)  # prunes every trial it is asked about
    _train(tuner, cluster, 300)
    trials = [(records.config_of(t.params), TrialRecord.read(t)) for t in tuner.study.trials]
    diverged = [(config, record) for config, record in trials if record and record.diverged]
    assert diverged and all(config.learning_rate >= 0.1 and record.steps == REPORT_EVERY for config, record in diverged)
    assert all(record.pruned for config, record in trials if record and config.learning_rate < 0.1)


def test_several_devices_are_timed_and_the_search_starts_where_more_groups_stop_paying(tmp_path) -> None:
    cluster, said = SimulatedCluster(devices=4, seconds_per_update={1: 0.04, 2: 0.021, 4: 0.02}), []
    tuner = _tuner(cluster, tmp_path, planned_steps=None, said=said)
    _train(tuner, cluster, 800)
    phase = PhaseRecord.read_all(tuner.study)[0]
    assert set(phase.seconds_per_update) == {1, 2, 4}
    assert phase.seconds_per_update[1] == pytest.approx(0.04, rel=0.1)
    # 4 groups are not 10% faster than 2: the search starts at 2.
    assert any("searching from 2 groups" in line for line in said)
    tried_groups = {records.config_of(t.params).num_groups for t in tuner.study.trials if TrialRecord.read(t).phase == 0}
    assert 2 in tried_groups and 4 not in tried_groups


def test_with_compensation_the_cold_start_takes_the_groups_worth_having_and_later_trials_wait_for_the_cap(tmp_path) -> None:
    cluster = SimulatedCluster(devices=4, seconds_per_update={1: 0.04, 2: 0.021, 4: 0.011}, compensated=True, cap_growth=1.002)
    cluster.loss = 1e6  # far above its floor, so that the trials of phase 1 still make progress
    said: list[str] = []
    tuner = _tuner(cluster, tmp_path, planned_steps=None, said=said)
    _train(tuner, cluster, 800)
    first, second = PhaseRecord.read_all(tuner.study)[:2]
    # Phase 0: the compiled settings at the most groups worth having, without trials.
    assert first.config == Config(4, 0.01, 0.9)
    assert not [t for t in tuner.study.trials if t.user_attrs.get("phase") == 0]
    assert any("searching from 4 groups, compensated (momenta are totals)" in line for line in said)
    assert any("from the timing alone" in line for line in said)
    # Phase 1 trains on until the cap allows half the step, then the trials continue from
    # one another, none restored: the incumbent, the learning rate half a decade up, the
    # incumbent again.
    assert any("omnivore phase 1: training with 4 groups while compensation's step cap warms up" in line for line in said)
    (settled,) = [line for line in said if line.startswith("omnivore phase 1: the step cap allows")]
    assert float(settled.split("allows ")[1].split()[0]) >= 0.5
    trials = [t for t in tuner.study.trials if t.user_attrs.get("phase") == 1]
    assert [records.config_of(t.params) for t in trials[:3]] == [Config(4, 0.01, 0.9), Config(4, 0.01 * 10**0.5, 0.9), Config(4, 0.01, 0.9)]
    assert BEST_SNAPSHOT not in cluster.restored and TRIAL_SNAPSHOT not in cluster.restored
    # Each trial starts from the probe loss the one before ended at: nothing is thrown away.
    ends = [TrialRecord.read(t) for t in trials if TrialRecord.read(t).probe_loss_end == TrialRecord.read(t).probe_loss_end]
    assert len(ends) >= 3
    assert all(later.probe_loss_start == earlier.probe_loss_end for earlier, later in zip(ends, ends[1:]))
    assert all(record.probe_loss_end < record.probe_loss_start for record in ends)
    # The bowl's best learning rate, at the groups that update soonest, total momentum 0.9.
    assert (second.config.num_groups, second.config.momentum) == (4, 0.9)
    assert second.config.learning_rate == pytest.approx(0.0316, rel=0.01)
    assert cluster.groups == 4


def test_a_continuing_trial_that_diverges_is_undone_from_where_it_began(tmp_path) -> None:
    cluster = SimulatedCluster(devices=4, seconds_per_update={1: 0.04, 2: 0.021, 4: 0.011}, compensated=True, cap_growth=1.01)
    cluster.loss = 1e6
    study = open_study(f"sqlite:///{tmp_path}/study.db", "test", warmup_steps=5)
    settings = TuningSettings(target_loss=0.05, max_trial_steps=20, planned_steps=None)
    # Half a decade up from 0.04 is past 0.1, where the simulated loss doubles every step.
    tuner = Tuner(cluster, study, settings, Config(4, 0.04, 0.9), MeasuredHardwareModel(4), say=[].append,
                  clock=lambda: cluster.seconds, compensated=True)
    _train(tuner, cluster, 800)
    trials = [(records.config_of(t.params), TrialRecord.read(t)) for t in study.trials if t.user_attrs.get("phase") == 1]
    diverged = [(k, config, record) for k, (config, record) in enumerate(trials) if record.diverged]
    assert diverged and all(config.learning_rate >= 0.1 for _, config, _ in diverged)
    assert cluster.restored.count(TRIAL_SNAPSHOT) == len(diverged)
    # The incumbent's next trial starts from the loss each diverged one started from.
    for k, _, record in diverged:
        after = trials[k + 1][1]
        assert after.probe_loss_start == record.probe_loss_start and after.probe_loss_end < after.probe_loss_start
    assert PhaseRecord.read_all(study)[1].config.learning_rate < 0.1


def test_timing_stops_once_the_largest_numbers_of_groups_decide(tmp_path) -> None:
    cluster, said = SimulatedCluster(devices=4, seconds_per_update={1: 0.04, 2: 0.03, 4: 0.01}), []
    tuner = _tuner(cluster, tmp_path, planned_steps=None, said=said)
    _train(tuner, cluster, 800)
    phase = PhaseRecord.read_all(tuner.study)[0]
    # 4 groups are more than 10% faster than 2: 1 group never needs timing.
    assert set(phase.seconds_per_update) == {2, 4}
    assert any("searching from 4 groups" in line for line in said)


class UnevenCluster(SimulatedCluster):
    """The other groups push between 0 and 3 updates for each of the chief's steps."""

    def __init__(self, devices: int, seconds_per_update: dict[int, float]) -> None:
        super().__init__(devices, seconds_per_update)
        self._random = random.Random(7)

    def train_step(self) -> Step:
        step = super().train_step()
        self.version += self._random.randint(0, 3) * (self.groups - 1) - (self.groups - 1)
        return Step(step.seconds, self.version, step.loss)


def test_every_trial_of_g_groups_runs_as_many_updates_whatever_the_chief_s_share(tmp_path) -> None:
    cluster = UnevenCluster(devices=4, seconds_per_update={1: 0.04, 2: 0.03, 4: 0.01})
    tuner = _tuner(cluster, tmp_path, planned_steps=None)
    _train(tuner, cluster, 800)
    updates: dict[int, list[int]] = collections.defaultdict(list)
    for trial in tuner.study.trials:
        record = TrialRecord.read(trial)
        if record is not None and not (record.diverged or record.pruned or record.interrupted):
            updates[records.config_of(trial.params).num_groups].append(record.updates)
    assert updates[4]
    for groups, counts in updates.items():
        # At least 20 steps' worth of updates, overshot by at most one step's burst.
        assert min(counts) >= 20 * groups and max(counts) - min(counts) <= 3 * (groups - 1), (groups, counts)


def test_past_the_target_trials_are_ranked_by_their_progress_not_by_a_tie(tmp_path) -> None:
    cluster = SimulatedCluster()
    study = open_study(f"sqlite:///{tmp_path}/study.db", "test", warmup_steps=5)
    # The loss starts at 2.3, below this target: every trial is past it at once.
    settings = TuningSettings(target_loss=3.0, max_trial_steps=20, planned_steps=None)
    tuner = Tuner(cluster, study, settings, Config(1, 0.01, 0.9), MeasuredHardwareModel(1), say=[].append,
                  clock=lambda: cluster.seconds)
    _train(tuner, cluster, 800)
    chosen = PhaseRecord.read_all(tuner.study)[0].config
    # The simulated optimum is a rate of 0.03 with momentum 0.9; a tie would have gone to
    # the smallest rate and momentum.
    assert chosen.momentum == 0.9 and 0.01 <= chosen.learning_rate <= 0.1


def test_tuning_stays_within_its_share_of_the_planned_training(tmp_path) -> None:
    cluster = SimulatedCluster()
    planned = 2000
    tuner = _tuner(cluster, tmp_path, planned_steps=planned)
    _train(tuner, cluster, planned)
    phases = PhaseRecord.read_all(tuner.study)
    planned_seconds = planned * cluster.seconds_per_update[1]
    spent = sum(phase.tuning_seconds for phase in phases)
    # The probes cost nothing here: the budget is all steps.
    assert 0 < spent <= 0.1 * planned_seconds * 1.15
    # (A trial still running when the steps run out has no record yet.)
    finished = [r for r in map(TrialRecord.read, tuner.study.trials) if r is not None]
    trial_steps = {r.steps for r in finished if not r.diverged}
    assert max(trial_steps) < 20  # trials shrank to fit


def test_a_short_run_drops_candidates_rather_than_overrun(tmp_path) -> None:
    cluster = SimulatedCluster()
    tuner = _tuner(cluster, tmp_path, planned_steps=300)
    _train(tuner, cluster, 300)
    finished = [t for t in tuner.study.trials if not TrialRecord.read(t).interrupted]
    assert 2 <= len(finished) < 10
    assert all(TrialRecord.read(t).steps <= 6 for t in finished)


def test_an_interrupted_trial_gives_way_to_the_best_weights(tmp_path) -> None:
    cluster = SimulatedCluster()
    tuner = _tuner(cluster, tmp_path, planned_steps=None)
    # Into the cold start: a few trials done, one running.
    _train(tuner, cluster, 3 + 20 * 3 + 7)
    best_loss, _ = cluster.snapshots[BEST_SNAPSHOT]
    tuner.end()
    assert cluster.restored[-1] == BEST_SNAPSHOT
    assert cluster.loss == best_loss
    assert (cluster.learning_rate, cluster.momentum) == (0.01, 0.9)
    interrupted = [TrialRecord.read(t) for t in tuner.study.trials if TrialRecord.read(t).interrupted]
    assert len(interrupted) == 1
    assert tuner.study.user_attrs[records.LOSS_CURVE]


def test_nothing_tried_helps_keeps_the_phase_s_weights_and_settings(tmp_path) -> None:
    cluster = SimulatedCluster()
    cluster.train_step = lambda: Step(cluster.seconds, cluster.version, math.nan)  # type: ignore[method-assign]

    def flat_step() -> Step:
        cluster.version += 1
        cluster.seconds += 0.01
        return Step(cluster.seconds, cluster.version, cluster.loss)

    cluster.train_step = flat_step  # type: ignore[method-assign]
    said: list[str] = []
    tuner = _tuner(cluster, tmp_path, planned_steps=None, said=said)
    _train(tuner, cluster, 800)
    assert any("no configuration made progress; keeping 1 group, momentum 0.9, learning rate 0.01" in line for line in said)
    assert PHASE_SNAPSHOT in cluster.restored


def test_a_later_run_of_the_same_study_starts_from_its_choice(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path}/shared.db"
    first = SimulatedCluster()
    _train(_tuner(first, tmp_path, storage=storage), first, 600)
    chosen = PhaseRecord.read_all(optuna.load_study(study_name="test", storage=storage))[0].config
    second, said = SimulatedCluster(), []
    tuner = _tuner(second, tmp_path, storage=storage, said=said)
    _train(tuner, second, 200)
    assert any("starting from what an earlier run of this study chose" in line for line in said)
    newest = [t for t in tuner.study.trials if TrialRecord.read(t) and TrialRecord.read(t).phase > 0]
    assert records.config_of(newest[0].params) == chosen
    assert not any(records.config_of(t.params).learning_rate == 0.0001 for t in newest), "no cold start again"
