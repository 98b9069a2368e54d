"""The training script of the epoch tests: every worker records which examples it trained
on, and in which batch. From arrays, the chief regroups the cluster in the middle of an
epoch; from a `keras.utils.PyDataset` or a Python generator (3 passes, then its end), the
groups stay.

Each example's id is its first feature; the worker writes `{batch: [ids]}` to
`--out/worker-<id>.json`, and the chief adds the epochs it ran and the layouts it saw.
With `--slow-chief`, the chief takes its time as it starts and at each epoch's end, as a
long tracing or validation would, and does not regroup.
"""

import argparse
import json
import pathlib
import time

import keras
import numpy as np
import tensorflow as tf

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--input", choices=["arrays", "py_dataset", "generator"], default="arrays")
parser.add_argument("--slow-chief", action="store_true")
args = parser.parse_args()

EXAMPLES, BATCH = 600, 20
strategy = omnikeras.GroupedAsyncStrategy()
worker = strategy.worker
read: dict[int, list[int]] = {}


class Record(keras.layers.Layer):
    """Passes its input on; in training, notes the ids of the rows this step reads."""

    def call(self, inputs, training=None):
        if training:
            noted = tf.numpy_function(self._note, [inputs[:, 0]], tf.int64, stateful=True)
            noted.set_shape(())
            inputs = inputs + tf.cast(0 * noted, inputs.dtype)
        return inputs

    def _note(self, ids: np.ndarray) -> np.int64:
        # The batch the step under way reads, as the server handed it out.
        read.setdefault(worker.reading, []).extend(int(i) for i in ids)
        return np.int64(0)


random = np.random.default_rng(0)
x = np.stack([np.arange(EXAMPLES), random.normal(size=EXAMPLES)], axis=1).astype("float32")
y = (x[:, 1] > 0).astype("int64")
with strategy.scope():
    model = keras.Sequential([keras.Input((2,)), Record(), keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")


class Regroup(keras.callbacks.Callback):
    """After the chief's first step of the second epoch, three groups become two."""

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.epoch, self.layouts = 0, []

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch
        self.layouts.append(worker.place.num_groups)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.epoch == 1 and batch == 0:
            worker.client.set_groups(num_groups=2)


class Slow(keras.callbacks.Callback):
    """Sleeps as training begins and at each epoch's end."""

    def on_train_begin(self, logs: dict | None = None) -> None:
        time.sleep(2.0)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        time.sleep(2.0)


class Batches(keras.utils.PyDataset):
    """The examples in order, `BATCH` a batch."""

    def __len__(self) -> int:
        return EXAMPLES // BATCH

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rows = slice(index * BATCH, (index + 1) * BATCH)
        return x[rows], y[rows]


def three_passes():
    for _ in range(3):
        for start in range(0, EXAMPLES, BATCH):
            yield x[start : start + BATCH], y[start : start + BATCH]


callbacks: list[keras.callbacks.Callback] = []
if worker.config.is_chief and args.input == "arrays":
    callbacks = [Slow()] if args.slow_chief else [Regroup()]
if args.input == "arrays":
    history = model.fit(x, y, batch_size=BATCH, epochs=args.epochs, callbacks=callbacks, verbose=0)
elif args.input == "py_dataset":
    history = model.fit(Batches(workers=2), epochs=args.epochs, verbose=0)
else:
    history = model.fit(three_passes(), epochs=args.epochs, verbose=0)
out = pathlib.Path(args.out)
summary = {"read": read}
if worker.config.is_chief:
    layouts = callbacks[0].layouts if callbacks and isinstance(callbacks[0], Regroup) else []
    summary.update(epochs=len(history.history["loss"]), layouts=[*layouts, worker.place.num_groups])
(out / f"worker-{worker.config.worker_id}.json").write_text(json.dumps(summary))
