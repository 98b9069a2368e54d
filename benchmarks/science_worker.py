"""The training script that `science.py` launches on every worker: one seed's trials.

Launched with one group. Every trial starts from the same snapshot of the first weights,
runs `--updates` updates with its number of groups and explicit momentum (the
learning rate fixed), and is scored by the loss of its final weights on a fixed batch of
training data. The chief drives the trials and prints one `TRIAL {json}` line for each:
the loss, the updates, the total momentum the parameter server measured from the trial's
updates, and the mean staleness it recorded. A trial whose loss stops being finite, or
that runs past `--trial-seconds`, is recorded as diverged.
"""

import argparse
import collections
import json
import math
import time

import keras

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--dataset", choices=["fashion_mnist", "digits"], required=True)
parser.add_argument("--seed", type=int, required=True, help="seed of the first weights")
parser.add_argument("--groups", required=True, help="comma-separated numbers of groups")
parser.add_argument("--momenta", required=True, help="comma-separated explicit momenta")
parser.add_argument("--updates", type=int, required=True, help="updates per trial")
parser.add_argument("--learning-rate", type=float, default=0.01)
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

    def __init__(self, plan: list[tuple[int, float]]) -> None:
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
        if self.worker.last_push is None:
            return  # a step the server did not take
        version = self.worker.last_push.model_version
        loss = (logs or {}).get("loss", math.nan)
        if version <= self.restored_at:
            return  # a step computed on the weights from before the restore
        elapsed = time.monotonic() - self.started
        diverged = not math.isfinite(loss) or self.worker.rejected_steps > self.rejected_before
        if diverged or elapsed > args.trial_seconds or version - self.restored_at >= args.updates:
            self.end(version, diverged or elapsed > args.trial_seconds)

    def begin(self) -> None:
        groups, momentum = self.plan[0]
        self.worker.change_update_rule(learning_rate=args.learning_rate, momentum=momentum)
        if groups != self.worker.place.num_groups:
            self.worker.client.set_groups(num_groups=groups)
        self.restored_at = self.worker.client.restore_snapshot("science-start")
        self.model.reset_metrics()
        self.staleness_before = self.staleness()
        self.rejected_before = self.worker.rejected_steps
        self.started = time.monotonic()

    def end(self, version: int, diverged: bool) -> None:
        groups, momentum = self.plan.pop(0)
        stats = self.worker.client.stats()[0]
        staleness = self.staleness() - self.staleness_before
        loss = math.nan if diverged else self.probe_loss()
        applied = sum(staleness.values())
        print("TRIAL " + json.dumps({
            "seed": args.seed,
            "groups": groups,
            "momentum": momentum,
            "loss": loss if math.isfinite(loss) else None,
            "start_loss": self.start_loss,
            "updates": version - self.restored_at,
            "seconds": time.monotonic() - self.started,
            "total_momentum": stats.total_momentum if math.isfinite(stats.total_momentum) else None,
            "mean_staleness": sum(lag * n for lag, n in staleness.items()) / applied if applied else None,
        }), flush=True)
        if self.plan:
            self.begin()
        else:
            self.model.stop_training = True

    def staleness(self) -> collections.Counter[int]:
        total: collections.Counter[int] = collections.Counter()
        for group in self.worker.client.stats()[0].groups:
            total.update(group.staleness_histogram)
        return total

    def probe_loss(self) -> float:
        x, y, sample_weight = self.probe
        return float(self.model.evaluate(x, y, sample_weight=sample_weight, batch_size=len(y), verbose=0))


keras.utils.set_random_seed(args.seed)
(x_train, y_train), _ = getattr(omnikeras.datasets, args.dataset)()
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = build_model(args.dataset)
    model.compile(optimizer=keras.optimizers.SGD(args.learning_rate), loss="sparse_categorical_crossentropy")
plan = [(int(g), float(m)) for g in args.groups.split(",") for m in args.momenta.split(",")]
callbacks = [Trials(plan)] if strategy.config.is_chief else []
model.fit(x_train, y_train, batch_size=args.batch_size, epochs=10_000, callbacks=callbacks, verbose=0)
