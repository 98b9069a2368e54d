"""Trains three epochs of eight batches on two groups while the chief takes a second after
each epoch, as a long validation would, and saves what its fit saw: the servers' updates
and its own epochs."""

import argparse
import time

import keras
import numpy as np

import omnikeras

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

(x, y), _ = omnikeras.datasets.digits()
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
chief = strategy.config.is_chief
pause = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: time.sleep(1.0 if chief else 0.0))
history = model.fit(x[:256], y[:256], batch_size=32, epochs=3, verbose=0, callbacks=[pause])
if chief:
    np.savez(args.out, updates=strategy.worker.client.stats()[0].updates_applied, epochs=len(history.epoch))
