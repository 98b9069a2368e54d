"""The training script that `science.py` launches on every worker: one seed's trials.

Launched with one group and compensation off. Each number of groups starts with a short
unrecorded trial, while the workers settle into the new layout. Every trial starts from the
same snapshot of the first weights (and a fresh state of the optimizer, `--optimizer`: SGD,
or Adam, whose momentum-like setting is `beta_1`) and runs `--updates` updates with its
number of groups, learning rate and momentum: the explicit momentum with compensation off,
the compiled one that compensation steers towards with it on (`--compensated-momenta`, at
the first learning rate and more than one group). The server keeps its weights at
`--checkpoints` evenly spaced updates; the chief scores them by their loss on a fixed batch
of training data: the last for the loss after the trial, and (by bisection, as the loss
falls) the first at or below `--target-loss` for the updates to it. It prints one `TRIAL
{json}` line for each trial: the loss, the updates to the target (null if not reached), the
updates, the total momentum the parameter server measured from the trial's updates, the
mean staleness it recorded and each group's updates. A trial whose loss stops being
finite, or that runs past `--trial-seconds`, is recorded as diverged.
"""

import argparse
import collections
import json
import math
import threading
import time

import keras

import omnikeras

# Updates of the unrecorded trial that starts each number of groups.
WARMUP_UPDATES = 30
# Seconds between two looks of the chief at the server's version during a trial.
WATCH_PERIOD = 0.02

parser = argparse.ArgumentParser()
parser.add_argument("--dataset", choices=["fashion_mnist", "digits"], required=True)
parser.add_argument("--seed", type=int, required=True, help="seed of the first weights")
parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd", help="the rule; momenta set Adam's beta_1")
parser.add_argument("--groups", required=True, help="comma-separated numbers of groups")
parser.add_argument("--momenta", required=True, help="comma-separated explicit momenta")
parser.add_argument("--updates", type=int, required=True, help="updates per trial")
parser.add_argument("--learning-rates", required=True, help="comma-separated learning rates")
parser.add_argument("--compensated-momenta", default="", help="comma-separated compiled momenta, compensated")
parser.add_argument("--target-loss", type=float, required=True, help="the loss whose updates to reach are counted")
parser.add_argument("--checkpoints", type=int, default=10, help="weights kept per trial, evenly spaced")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--probe-examples", type=int, default=2048)
parser.add_argument("--trial-seconds", type=float, default=300.0)
args = parser.parse_args()


def build_model(dataset: str) -> keras.Model:
    if dataset == "digits":
        # A small MLP: a problem where a trial of a few hundred updates is seconds.
        return keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
    import pathlib
    import sys

    # The main job's CNN, as `make run` trains it.
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
    import fashion_mnist

    return fashion_mnist.build_model()


class Trials(keras.callbacks.Callback):
    """Runs every (groups, momentum) trial from one snapshot, on the chief."""

    def __init__(self, plan: list[tuple[int, float, float, bool, bool]]) -> None:
        super().__init__()
        self.plan = plan
        self.worker = strategy.worker

    def on_train_begin(self, logs: dict | None = None) -> None:
        # The first weights: the launch's one group waits for the chief, so none of the
        # other workers' steps has changed them yet.
        self.probe = self.worker.probe(args.probe_examples)
        self.worker.client.save_snapshot("science-start")
        self.start_loss = self.probe_loss()
        self.begin()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        loss = (logs or {}).get("loss", math.nan)
        after_restore = self.worker.last_push is not None and self.worker.last_push.model_version > self.restored_at
        diverged = after_restore and (not math.isfinite(loss) or self.worker.rejected_steps > self.rejected_before)
        timed_out = time.monotonic() - self.started > args.trial_seconds
        if self.ended.is_set() or diverged or timed_out:
            self.end(diverged or timed_out)

    def begin(self) -> None:
        groups, learning_rate, momentum, compensated, recorded = self.plan[0]
        self.worker.change_update_rule(
            learning_rate=learning_rate, momentum=momentum, compensate_asynchrony=compensated
        )
        if groups != self.worker.place.num_groups:
            self.worker.client.set_groups(num_groups=groups)
        self.restored_at = self.worker.client.restore_snapshot("science-start")
        # Gradients of the weights before the restore are refused: no update can come
        # between the two.
        self.before = self.server_counts()
        self.model.reset_metrics()
        self.rejected_before = self.worker.rejected_steps
        self.started = time.monotonic()
        self.ended = threading.Event()
        updates = args.updates if recorded else WARMUP_UPDATES
        threading.Thread(target=self.watch, args=(self.restored_at + updates, self.ended), daemon=True).start()

    def watch(self, last_version: int, ended: threading.Event) -> None:
        """Keeps the server's weights at each checkpoint and ends the trial on the server the
        moment it reaches its updates, whatever the chief is doing: the weights then, and
        the server's counts, are the trial's."""
        updates = last_version - self.restored_at
        due = [self.restored_at + math.ceil(updates * k / args.checkpoints) for k in range(1, args.checkpoints + 1)]
        self.kept: list[int] = []
        while not ended.is_set():
            version = self.worker.client.stats()[0].model_version
            if version >= due[len(self.kept)]:
                self.worker.client.save_snapshot(f"science-at-{len(self.kept)}")
                self.kept.append(version - self.restored_at)
            if len(self.kept) == len(due):
                self.after = self.server_counts()
                ended.set()
            # A read of the server's stats costs the chief's host a share of its core:
            # polled faster, the chief's group falls behind the others. A trial overruns by
            # the updates of one period and of the chief's waits for its share of the core
            # (mostly a few, at most 44 of 150 on digits at 8 groups); its record counts them.
            time.sleep(WATCH_PERIOD)

    def end(self, diverged: bool) -> None:
        finished = self.ended.is_set()
        self.ended.set()
        groups, learning_rate, momentum, compensated, recorded = self.plan.pop(0)
        if not recorded:
            self.begin()
            return
        loss, to_target = math.nan, None
        if finished and not diverged:
            loss, to_target = self.score()
        before = self.before
        after = self.after if finished else self.server_counts()
        staleness = after["staleness"] - before["staleness"]
        applied = sum(staleness.values())
        print("TRIAL " + json.dumps({
            "seed": args.seed,
            "groups": groups,
            "learning_rate": learning_rate,
            "momentum": momentum,
            "compensated": compensated,
            "loss": loss if math.isfinite(loss) else None,
            "updates_to_target": to_target,
            "start_loss": self.start_loss,
            "updates": applied,
            "seconds": time.monotonic() - self.started,
            "total_momentum": after["total_momentum"],
            "mean_staleness": sum(lag * n for lag, n in staleness.items()) / applied if applied else None,
            "updates_by_group": [after["updates"][g] - before["updates"][g] for g in range(groups)],
        }), flush=True)
        if self.plan:
            self.begin()
        else:
            self.model.stop_training = True

    def score(self) -> tuple[float, int | None]:
        """The loss of the trial's last weights, and the updates to the first checkpoint at
        or below the target loss (None if none is)."""
        losses: dict[int, float] = {}

        def loss_at(k: int) -> float:
            if k not in losses:
                # The chief's own weights may be a few updates past the checkpoint's: take
                # the server's.
                self.worker.client.restore_snapshot(f"science-at-{k}")
                self.worker.assign(self.model, self.worker.client.pull().weights)
                losses[k] = self.probe_loss()
            return losses[k]

        last = len(self.kept) - 1
        if not loss_at(last) <= args.target_loss:
            return loss_at(last), None
        low, high = -1, last  # the loss is above the target at `low` (-1: the start), at or below at `high`
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if loss_at(middle) <= args.target_loss else (middle, high)
        return loss_at(last), self.kept[high]

    def server_counts(self) -> dict:
        stats = self.worker.client.stats()[0]
        staleness: collections.Counter[int] = collections.Counter()
        for group in stats.groups:
            staleness.update(group.staleness_histogram)
        return {
            "staleness": staleness,
            "updates": collections.Counter({group.group: group.updates_applied for group in stats.groups}),
            "total_momentum": stats.total_momentum if math.isfinite(stats.total_momentum) else None,
        }

    def probe_loss(self) -> float:
        x, y, sample_weight = self.probe
        return float(self.model.evaluate(x, y, sample_weight=sample_weight, batch_size=len(y), verbose=0))


keras.utils.set_random_seed(args.seed)
(x_train, y_train), _ = getattr(omnikeras.datasets, args.dataset)()
# Whole batches only: a last, smaller one would make every worker trace its step again at
# the end of the first pass, all at once, and stall the trial under way.
whole = len(x_train) // args.batch_size * args.batch_size
x_train, y_train = x_train[:whole], y_train[:whole]
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = build_model(args.dataset)
    # Each trial sets the learning rate and the momentum-like setting; Adam's others stay
    # Keras' defaults.
    optimizer = keras.optimizers.Adam() if args.optimizer == "adam" else keras.optimizers.SGD()
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
rates, momenta = [float(r) for r in args.learning_rates.split(",")], [float(m) for m in args.momenta.split(",")]
compensated_momenta = [float(m) for m in args.compensated_momenta.split(",") if m]
plan = []
for g in map(int, args.groups.split(",")):
    # Unrecorded: each worker traces its step for its new share of the batch meanwhile.
    plan.append((g, rates[0], 0.0, False, False))
    plan += [(g, rate, m, False, True) for rate in rates for m in momenta]
    if g > 1:
        plan += [(g, rates[0], m, True, True) for m in compensated_momenta]
callbacks = [Trials(plan)] if strategy.config.is_chief else []
model.fit(x_train, y_train, batch_size=args.batch_size, epochs=10_000, callbacks=callbacks, verbose=0)
