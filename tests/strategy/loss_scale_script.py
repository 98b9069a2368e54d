"""The training script of the loss-scaling tests: mixed precision, whose
`LossScaleOptimizer` starts from a loss scale so large that the first steps' gradients
overflow float16, on a launched cluster or as plain Keras.

Prints one line `RESULT {json}` with what the tests check: the loss scale after each of
this worker's steps, among others.
"""

import argparse
import contextlib
import json
import time

import keras

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--plain", action="store_true", help="train in this process without the strategy")
parser.add_argument("--initial-scale", type=float, default=2.0**24)
args = parser.parse_args()

keras.utils.set_random_seed(0)
keras.mixed_precision.set_global_policy("mixed_float16")
(x_train, y_train), _ = omnikeras.datasets.digits()
x_train, y_train = x_train[:256], y_train[:256]
strategy = None if args.plain else omnikeras.GroupedAsyncStrategy()


def build() -> keras.Model:
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10),
        keras.layers.Activation("softmax", dtype="float32"),
    ])
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=args.initial_scale, dynamic_growth_steps=1000
    )
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


with strategy.scope() if strategy else contextlib.nullcontext():
    model = build()
scales: list[float] = []


def note_scale(batch: int, logs: dict) -> None:
    scales.append(float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale)))


started = time.monotonic()
model.fit(
    x_train, y_train, batch_size=32, epochs=1, shuffle=False, verbose=0,
    callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=note_scale)],
)
result = {
    "seconds": time.monotonic() - started,
    "scales": scales,
    "iterations": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
    "weights": [w.tolist() for w in model.get_weights()],
}
if strategy is not None:
    stats = strategy.worker.client.stats()[0]
    result |= {
        "steps": strategy.worker.step,
        "server_version": stats.model_version,
        "workers_dropped": stats.workers_dropped,
    }
print("RESULT " + json.dumps(result), flush=True)
