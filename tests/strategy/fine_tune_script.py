"""keras-io's transfer learning through the strategy: a head trained on a frozen base
(which keeps its batch normalization in inference mode), then the base unfrozen and the
model recompiled with a lower rate for a second `fit`. No seed: each worker initialises
its own base, and the frozen one must be the chief's everywhere. Writes what each stage
left on this worker: its History, the frozen base's kernel, its weights and, on the
chief, whether the servers hold them."""

import argparse
import json
import pathlib

import keras
import numpy as np

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

(x, y), (x_val, y_val) = omnikeras.datasets.digits()
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    base = keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.BatchNormalization()],
        name="base",
    )
    base.trainable = False
    inputs = keras.Input((8, 8, 1))
    features = keras.layers.Flatten()(base(inputs, training=False))
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(features))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
head = model.fit(x, y, batch_size=32, epochs=2, validation_data=(x_val, y_val), verbose=0)
frozen = keras.ops.convert_to_numpy(base.layers[0].kernel)

base.trainable = True
with strategy.scope():
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
tuned = model.fit(x, y, batch_size=32, epochs=2, validation_data=(x_val, y_val), verbose=0)

result: dict = {
    "head": head.history,
    "tuned": tuned.history,
    "base_trained": not np.array_equal(frozen, keras.ops.convert_to_numpy(base.layers[0].kernel)),
    "trainable": len(model.trainable_variables),
}
if strategy.config.is_chief:
    held = strategy.worker.client.pull().weights
    result["servers_hold"] = sorted(held) == sorted(v.path for v in model.trainable_variables + base.layers[1].non_trainable_variables)
    result["servers_hold_them"] = all(np.array_equal(keras.ops.convert_to_numpy(v), held[v.path]) for v in model.trainable_variables)
index = strategy.config.worker_index
np.save(pathlib.Path(args.out, f"frozen-{index}.npy"), frozen)
np.savez(pathlib.Path(args.out, f"weights-{index}.npz"), *model.get_weights())
pathlib.Path(args.out, f"worker-{index}.json").write_text(json.dumps(result))
