"""Trains one small model through the strategy (one launched worker) and the same model
with plain Keras in this process, from the same first weights on the same full batch,
and saves both: Keras semantics the server must keep.

`--case schedule`: BatchNormalization, an ExponentialDecay schedule, weight decay that
leaves the biases alone, a variable without a gradient placed first, Keras' built-in
constraints on the output's kernel and on batch normalization's scale (MinMaxNorm with a
rate below 1, which moves a weight only part of the way), and gradients accumulated over
2 steps.
`--case callbacks`: a constant rate that LearningRateScheduler halves every 20 epochs,
and a moving average of the weights (`use_ema`) that overwrites them every 50 updates and
that the model ends with.
"""

import argparse

import keras
import numpy as np

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=["schedule", "callbacks"], required=True)
parser.add_argument("--epochs", type=int, default=200)
parser.add_argument("--out", required=True)
args = parser.parse_args()


class Unused(keras.layers.Layer):
    """A layer with a weight no loss depends on: Keras has no gradient for it."""

    def build(self, input_shape: tuple) -> None:
        self.idle = self.add_weight(shape=(3,), initializer="ones", name="idle")

    def call(self, inputs):
        return inputs


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    constrained = args.case == "schedule"
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        Unused(),
        keras.layers.Conv2D(4, 3),
        keras.layers.BatchNormalization(gamma_constraint=keras.constraints.MinMaxNorm(0.5, 1.5, rate=0.5) if constrained else None),
        keras.layers.Activation("relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax", kernel_constraint=keras.constraints.MaxNorm(0.5) if constrained else None),
    ])
    if args.case == "schedule":
        rate = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=20, decay_rate=0.5)
        optimizer = keras.optimizers.SGD(rate, momentum=0.9, weight_decay=0.01, gradient_accumulation_steps=2)
        optimizer.exclude_from_weight_decay(var_names=["bias"])
    else:
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9, use_ema=True, ema_overwrite_frequency=50)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


def callbacks() -> list[keras.callbacks.Callback]:
    if args.case == "schedule":
        return []
    return [keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate / 2 if epoch and epoch % 20 == 0 else rate)]


(x, y), _ = omnikeras.datasets.digits()
x, y = x[:128], y[:128]
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    ours = build()
plain = build()
plain.set_weights(ours.get_weights())
# One full batch a step: both see the same gradients, whatever the order of examples.
ours.fit(x, y, batch_size=len(x), epochs=args.epochs, verbose=0, callbacks=callbacks())
plain.fit(x, y, batch_size=len(x), epochs=args.epochs, verbose=0, shuffle=False, callbacks=callbacks())
stats = strategy.worker.client.stats()[0]
np.savez(
    args.out,
    updates=stats.updates_applied,
    learning_rate=strategy.worker.client.describe().hyperparameters.learning_rate,
    idle=keras.ops.convert_to_numpy(ours.layers[0].idle),
    output_kernel=keras.ops.convert_to_numpy(ours.layers[-1].kernel),
    **{f"ours_{i}": w for i, w in enumerate(ours.get_weights())},
    **{f"plain_{i}": w for i, w in enumerate(plain.get_weights())},
)
print("SAVED", flush=True)
