"""The training script the strategy tests run, on a launched cluster or as plain Keras.

Prints one line `RESULT {json}` with what the tests check.
"""

import argparse
import contextlib
import json
import os
import signal
import time

import keras
import numpy as np

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--plain", action="store_true", help="train in this process without the strategy")
parser.add_argument("--examples", type=int, default=256)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--learning-rate", type=float, default=0.1)
parser.add_argument("--momentum", type=float, default=0.9, help="SGD's momentum, or Adam's beta_1")
parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
parser.add_argument("--shuffle", action="store_true")
parser.add_argument("--weights-out")
parser.add_argument("--die-after", type=int, help="worker 1 kills itself after this many batches, once")
parser.add_argument("--died-marker", help="where worker 1 notes that it died, so that its restart lives")
parser.add_argument("--stall-after", type=int, help="worker 1 stops for --stall-seconds after this many batches")
parser.add_argument("--stall-seconds", type=float, default=0.0)
parser.add_argument("--callbacks-dir", help="also run the standard Keras callbacks, writing here")
parser.add_argument("--batch-norm", action="store_true", help="batch normalization after the convolution")
args = parser.parse_args()

keras.utils.set_random_seed(0)
(x_train, y_train), (x_test, y_test) = omnikeras.datasets.digits()
x_train, y_train = x_train[: args.examples], y_train[: args.examples]
strategy = None if args.plain else omnikeras.GroupedAsyncStrategy()


def build() -> keras.Model:
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        *([keras.layers.BatchNormalization()] if args.batch_norm else []),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(
        optimizer=(
            keras.optimizers.SGD(args.learning_rate, momentum=args.momentum)
            if args.optimizer == "sgd"
            else keras.optimizers.Adam(args.learning_rate, beta_1=args.momentum)
        ),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


with strategy.scope() if strategy else contextlib.nullcontext():
    model = build()

callbacks: list[keras.callbacks.Callback] = []
second_worker = strategy is not None and strategy.config.worker_index == 1


def die(batch: int, logs: dict) -> None:
    if batch + 1 >= args.die_after and not os.path.exists(args.died_marker):
        open(args.died_marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def stall(batch: int, logs: dict) -> None:
    if batch + 1 == args.stall_after and not getattr(stall, "done", False):
        stall.done = True
        print(f"worker 1 stalls for {args.stall_seconds:g} s", flush=True)
        time.sleep(args.stall_seconds)


if args.die_after is not None and second_worker:
    callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=die))
if args.stall_after is not None and second_worker:
    callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=stall))
if args.callbacks_dir:
    callbacks += [
        keras.callbacks.ModelCheckpoint(os.path.join(args.callbacks_dir, "model.keras")),
        keras.callbacks.EarlyStopping(monitor="loss", patience=100),
        keras.callbacks.CSVLogger(os.path.join(args.callbacks_dir, "log.csv")),
        keras.callbacks.TensorBoard(os.path.join(args.callbacks_dir, "tensorboard")),
    ]

history = model.fit(
    x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, shuffle=args.shuffle,
    validation_data=(x_test, y_test), callbacks=callbacks, verbose=2,
)
result = {
    "history": history.history,
    "test_accuracy": float(model.evaluate(x_test, y_test, verbose=0)[1]),
}
if strategy is not None:
    worker = strategy.worker
    stats = worker.client.stats()[0]
    result |= {
        "worker_index": strategy.config.worker_index,
        "rows_per_step": worker.example_count,
        "steps": worker.step,
        "server_version": stats.model_version,
        "staleness": {g.group: dict(g.staleness_histogram) for g in stats.groups},
        "weights_checksum": float(sum(np.sum(w) for w in model.get_weights())),
        "statistics": [keras.ops.convert_to_numpy(v).tolist() for v in worker.statistics],
    }
if args.weights_out:
    np.savez(args.weights_out, *model.get_weights())
print("RESULT " + json.dumps(result), flush=True)
