"""The training script that `time_to_accuracy.py` runs: launched on every worker, or with
`--plain` as plain Keras in one process.

The chief (or the plain process) checks the test accuracy every few seconds and stops
training (for every worker) once it reaches the target, printing `REACHED <seconds since
fit began> accuracy <a> updates <n>` (n: the updates applied so far), or `NOT REACHED ...`
when the time runs out. When the planned epochs end first, the accuracy then decides which.

Between checks it keeps a copy of the weights every `--snapshot-every` seconds (a copy
costs about a millisecond; a check, a pass over the test examples, a few hundred): once a
check finds the target, the snapshots since the check before are evaluated after
training, and the first that reaches it gives the time. A time is then as fine as the
snapshots, not as coarse as the checks, on both sides alike.
"""

import argparse
import contextlib
import pathlib
import sys
import time

import keras

import omnikeras

# The main job's CNN, so that the benchmark times the model `make run` trains.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import fashion_mnist as fashion_mnist_example

parser = argparse.ArgumentParser()
parser.add_argument("--dataset", choices=["fashion_mnist", "digits"], required=True)
parser.add_argument("--target-accuracy", type=float, required=True)
parser.add_argument("--max-seconds", type=float, required=True)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--learning-rate", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--plain", action="store_true", help="plain Keras in this process, no strategy")
parser.add_argument("--adam", action="store_true", help="Adam with Keras' defaults instead of SGD")
parser.add_argument("--omnivore-target-loss", type=float, help="tune with OmnivoreCallback towards this loss")
parser.add_argument("--budget", type=int, default=40)
parser.add_argument("--epochs", type=int, default=5, help="the planned training, which the tuner budgets against")
parser.add_argument("--storage")
parser.add_argument("--check-every", type=float, default=2.0, help="seconds between accuracy checks")
parser.add_argument("--check-examples", type=int, default=2000, help="test examples each check evaluates")
parser.add_argument("--snapshot-every", type=float, default=0.25, help="seconds between copies of the weights")
args = parser.parse_args()


def updates_applied(model: keras.Model) -> int:
    """The updates the model's weights have taken: the server's, under the strategy."""
    if strategy is not None and strategy.worker.last_push is not None:
        return strategy.worker.last_push.model_version
    return int(model.optimizer.iterations.numpy())


class StopAtAccuracy(keras.callbacks.Callback):
    def __init__(self, x, y) -> None:
        super().__init__()
        self.x, self.y = x, y

    def on_train_begin(self, logs=None) -> None:
        self.started = self.last_check = self.last_snapshot = time.monotonic()
        # (seconds since fit began, updates, weights) since the last check that missed.
        self.snapshots: list[tuple[float, int, list]] = []
        self.reached: tuple[float, float, int] | None = None

    def on_train_batch_end(self, batch, logs=None) -> None:
        now = time.monotonic()
        if now - self.last_check < args.check_every:
            if now - self.last_snapshot >= args.snapshot_every:
                self.last_snapshot = now
                self.snapshots.append((now - self.started, updates_applied(self.model), self.model.get_weights()))
            return
        self.last_check = now
        accuracy = self.model.evaluate(self.x, self.y, verbose=0, batch_size=1024)[1]
        elapsed = now - self.started
        if accuracy >= args.target_accuracy:
            self.reached = (elapsed, accuracy, updates_applied(self.model))
            self.model.stop_training = True
        elif elapsed > args.max_seconds:
            print(f"NOT REACHED {elapsed:.2f} accuracy {accuracy:.4f} updates {updates_applied(self.model)}", flush=True)
            self.model.stop_training = True
        else:
            self.snapshots.clear()

    def report_reached(self) -> None:
        """Prints the first snapshot since the last missed check that reaches the target,
        or the check that found it."""
        assert self.reached is not None
        elapsed, accuracy_at_check, updates = self.reached
        for at, updates_then, weights in self.snapshots:
            self.model.set_weights(weights)
            accuracy = self.model.evaluate(self.x, self.y, verbose=0, batch_size=1024)[1]
            if accuracy >= args.target_accuracy:
                print(f"REACHED {at:.2f} accuracy {accuracy:.4f} updates {updates_then} (a snapshot; the check at {elapsed:.2f} s)", flush=True)
                return
        print(f"REACHED {elapsed:.2f} accuracy {accuracy_at_check:.4f} updates {updates}", flush=True)


keras.utils.set_random_seed(0)
(x_train, y_train), (x_test, y_test) = getattr(omnikeras.datasets, args.dataset)()
strategy = None if args.plain else omnikeras.GroupedAsyncStrategy()
with strategy.scope() if strategy else contextlib.nullcontext():
    if args.dataset == "digits":
        model = keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
    else:
        model = fashion_mnist_example.build_model()
    optimizer = keras.optimizers.Adam() if args.adam else keras.optimizers.SGD(args.learning_rate, momentum=args.momentum)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
callbacks: list[keras.callbacks.Callback] = []
if args.omnivore_target_loss:
    callbacks.append(omnikeras.OmnivoreCallback(args.omnivore_target_loss, storage=args.storage, budget=args.budget))
if strategy is None or strategy.config.is_chief:
    # A fixed part of the test set keeps each check short: the chief's group waits for it.
    callbacks.append(StopAtAccuracy(x_test[: args.check_examples], y_test[: args.check_examples]))
model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks, verbose=0)
# Only the chief checks: the other workers have nothing to report.
checker = callbacks[-1] if callbacks else None
if isinstance(checker, StopAtAccuracy) and checker.reached is not None:
    checker.report_reached()
elif isinstance(checker, StopAtAccuracy) and not model.stop_training:
    accuracy = model.evaluate(checker.x, checker.y, verbose=0, batch_size=1024)[1]
    # The target may have been crossed after the last check: then it counts as reached now.
    reached = "REACHED" if accuracy >= args.target_accuracy else "NOT REACHED"
    print(
        f"{reached} {time.monotonic() - checker.started:.2f} accuracy {accuracy:.4f} updates {updates_applied(model)} "
        "(the planned epochs ended)",
        flush=True,
    )
