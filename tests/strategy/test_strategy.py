"""The strategy in this process, with one worker and an in-process parameter server."""

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import keras
import numpy as np
import pytest
import tensorflow as tf

import omnikeras
from omnikeras import ParameterServer, ParameterServerClient, WorkerConfig
from omnikeras.config import ENV_VAR
from omnikeras.strategy import data
from omnikeras.strategy.worker import ClusterWorker


def _model(strategy: omnikeras.GroupedAsyncStrategy, optimizer: type, **settings: float) -> keras.Model:
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=optimizer(**settings), loss="sparse_categorical_crossentropy")
    return model


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


def test_every_step_goes_through_the_server_hook(server) -> None:
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    model = _model(strategy, keras.optimizers.SGD, learning_rate=0.5, momentum=0.5)
    x, y = _data()
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    # The server applied every step: 96 / 32 batches in each of 3 epochs.
    assert history.history["model_version"] == [3, 6, 9]
    assert history.history["loss"][-1] < history.history["loss"][0]
    server_weights = ParameterServerClient([server.address]).pull().weights
    for variable in model.trainable_variables:
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), server_weights[variable.path])
    assert server.coordinator.hyperparameters().momentum == 0.5


def test_other_models_in_the_process_train_as_usual() -> None:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
    before = [keras.ops.convert_to_numpy(w).copy() for w in model.trainable_variables]
    model.fit(*_data(), batch_size=32, epochs=1, verbose=0)
    assert any(not np.array_equal(b, keras.ops.convert_to_numpy(w)) for b, w in zip(before, model.trainable_variables))


_SCRIPT_RUN_WITH_PYTHON = """
import os, keras, numpy as np, omnikeras
strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
rng = np.random.default_rng(0)
x = rng.normal(size=(96, 4)).astype("float32")
history = model.fit(x, (x[:, 0] > 0).astype("int64"), batch_size=32, epochs=3, verbose=0)
print("RESULT", history.history["model_version"], history.history["loss"][0] > history.history["loss"][-1])
children = [p for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getpid())]
print("CHILDREN", " ".join(children))
"""


def test_a_script_run_with_python_trains_as_a_single_worker_of_its_own_cluster() -> None:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "TF_CONFIG")}
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT_RUN_WITH_PYTHON], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "RESULT [3, 6, 9] True" in run.stdout
    assert "training as a single worker" in run.stderr
    log = run.stderr.split("(log: ")[1].split(")")[0]
    children = run.stdout.split("CHILDREN")[1].split()
    assert children, "the script started its parameter server"
    # The server the script started ended with it.
    assert not [pid for pid in children if os.path.exists(f"/proc/{pid}")], "the script's parameter server outlived it"
    assert "listening" in open(log).read()
    os.remove(log)


def test_a_missing_worker_is_reported_rather_than_awaited(server) -> None:
    config = WorkerConfig((server.address,), num_workers=2, startup_timeout=0.5)
    model = _model(omnikeras.GroupedAsyncStrategy(config), keras.optimizers.SGD)
    with pytest.raises(TimeoutError, match="only 1 of 2 workers joined"):
        model.fit(*_data(), batch_size=32, epochs=1, verbose=0)


@contextmanager
def _fresh_server() -> Iterator[ParameterServer]:
    """A parameter server of its own for each of a test's trainings, which it compares."""
    server = ParameterServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_shared_memory_and_grpc_train_bit_identical_models() -> None:
    trained = {}
    for shared_memory in (True, False):
        with _fresh_server() as server:
            keras.utils.set_random_seed(0)
            strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,), shared_memory=shared_memory))
            model = _model(strategy, keras.optimizers.SGD, learning_rate=0.5, momentum=0.5)
            model.fit(*_data(), batch_size=32, epochs=3, verbose=0)
            assert strategy.worker.client.shared_memory_shards == ([server.address] if shared_memory else [])
            trained[shared_memory] = model.get_weights()
    for through_memory, through_grpc in zip(trained[True], trained[False]):
        np.testing.assert_array_equal(through_memory, through_grpc)


def _two_layer_model(
    strategy: omnikeras.GroupedAsyncStrategy, optimizer: Callable[[], keras.optimizers.Optimizer] | None = None
) -> keras.Model:
    # Named, so that every model of this test lays its variables out alike on the server:
    # its update over whole buffers rounds each element by where it lies (see `flat_state`).
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu", name="hidden"),
            keras.layers.Dense(3, activation="softmax", name="output"),
        ], name="two_layers")
        model.compile(
            optimizer=optimizer() if optimizer else keras.optimizers.SGD(0.3, momentum=0.5),
            loss="sparse_categorical_crossentropy",
        )
    return model


@pytest.mark.parametrize(
    ("shared_memory", "optimizer"),
    [
        (True, lambda: keras.optimizers.SGD(0.3, momentum=0.5)),
        (False, lambda: keras.optimizers.SGD(0.3, momentum=0.5)),
        (True, lambda: keras.optimizers.Adam(0.05)),
        (True, lambda: keras.optimizers.Adagrad(0.3)),
    ],
    ids=["sgd-shared-memory", "sgd-grpc", "adam-shared-memory", "adagrad-shared-memory"],
)
def test_gradients_written_ahead_train_the_same_bits_as_one_push(
    monkeypatch, shared_memory: bool, optimizer: Callable[[], keras.optimizers.Optimizer]
) -> None:
    """Gradients written ahead of the push train the same bits as one push of them all,
    under optimizers updated in place (SGD, Adam) and on new arrays (Adagrad)."""
    trained = {}
    for written_ahead in (True, False):
        if not written_ahead:
            monkeypatch.setattr(omnikeras.strategy.strategy, "ahead_count", lambda trained: 0)
        server = ParameterServer()
        server.start()
        try:
            keras.utils.set_random_seed(0)
            strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,), shared_memory=shared_memory))
            client = strategy.worker.client
            written: list[list[str]] = []
            write_ahead = client.write_ahead
            monkeypatch.setattr(
                client, "write_ahead", lambda gradients: (written.append(sorted(gradients)), write_ahead(gradients))
            )
            model = _two_layer_model(strategy, optimizer)
            model.fit(*_data(), batch_size=32, epochs=3, verbose=0)
            # The later layer's kernel and bias went ahead at every step.
            later = sorted(v.path for v in model.layers[1].trainable_variables)
            assert written == ([later] * 9 if written_ahead else [])
            assert server.coordinator.stats().updates_applied == 9
            trained[written_ahead] = model.get_weights()
        finally:
            server.stop()
    for ahead, at_once in zip(trained[True], trained[False]):
        np.testing.assert_array_equal(ahead, at_once)


class _BackpropWaitsForTheWriteAhead(keras.layers.Layer):
    """The identity, whose gradient at the n-th step waits (up to 10 s) until the n-th
    step's gradients were written ahead; `waited` records whether they came in time."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.waited: list[bool] = []
        self._written = threading.Condition()

    def count_write(self) -> None:
        with self._written:
            self.writes += 1
            self._written.notify_all()

    def call(self, x: tf.Tensor) -> tf.Tensor:
        @tf.custom_gradient
        def gate(x: tf.Tensor) -> tuple[tf.Tensor, Callable]:
            def wait(dy: np.ndarray) -> np.ndarray:
                step = len(self.waited) + 1
                with self._written:
                    self.waited.append(self._written.wait_for(lambda: self.writes >= step, timeout=10.0))
                return dy

            def gradient(dy: tf.Tensor) -> tf.Tensor:
                # Stateless, so that nothing but its input orders it in the step.
                return tf.ensure_shape(tf.numpy_function(wait, [dy], dy.dtype, stateful=False), dy.shape)

            return tf.identity(x), gradient

        return gate(x)


def test_gradients_are_written_ahead_while_backpropagation_computes_the_rest(monkeypatch, server) -> None:
    """The later layer's gradients go to the client before the first layer's exist: the
    first layer's backpropagation here cannot finish until they have."""
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    client, gate = strategy.worker.client, _BackpropWaitsForTheWriteAhead()
    write_ahead = client.write_ahead
    monkeypatch.setattr(client, "write_ahead", lambda gradients: (write_ahead(gradients), gate.count_write()))
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            gate,
            keras.layers.Dense(3, activation="softmax"),
        ])
        model.compile(optimizer=keras.optimizers.SGD(0.3), loss="sparse_categorical_crossentropy")
    model.fit(*_data(), batch_size=32, epochs=1, verbose=0)
    assert gate.waited == [True, True, True]
    assert server.coordinator.stats().updates_applied == 3


def test_the_model_keeps_no_memory_of_the_shared_segment(server) -> None:
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    model = _model(strategy, keras.optimizers.SGD, learning_rate=0.5)
    changed: list[bool] = []

    def overwrite_the_segment(batch: int, logs: dict) -> None:
        # TensorFlow must have copied the weights the step handed it, since the next push
        # overwrites the segment.
        (channel,) = strategy.worker.client._channels
        trained = model.get_weights()
        for array in channel.weights.values():
            array[...] = np.nan
        changed.append(any(not np.array_equal(a, b) for a, b in zip(trained, model.get_weights())))

    model.fit(*_data(), batch_size=32, epochs=1, verbose=0, callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=overwrite_the_segment)])
    assert changed == [False, False, False]


def test_training_stops_with_a_clear_error_after_too_many_refused_steps(server) -> None:
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    model = _model(strategy, keras.optimizers.SGD, learning_rate=0.1)
    x, y = _data()
    x[:] = np.nan  # every gradient is NaN: the server refuses each step
    with pytest.raises(FloatingPointError, match="NaN or Inf for 11 steps in a row"):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    stats = server.coordinator.stats()
    assert stats.pushes_rejected_non_finite == 11 and stats.updates_applied == 0
    # The refusals changed nothing on the server.
    weights = ParameterServerClient([server.address]).pull().weights
    assert all(np.isfinite(w).all() for w in weights.values())


_ONE_INTER_OP_THREAD = """
import json
import keras
import numpy as np
import omnikeras
from omnikeras import ParameterServer, WorkerConfig

server = ParameterServer()
server.start()
strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
x = np.random.default_rng(0).normal(size=(96, 4)).astype(np.float32)
history = model.fit(x, (x[:, 0] > 0).astype(np.int64), batch_size=32, epochs=3, verbose=0)
server.stop()
print(json.dumps(history.history["model_version"]))
"""


def test_a_worker_with_one_inter_op_thread_trains() -> None:
    # A profile may give a worker one inter-op thread: the step's exchange and the
    # reading of its share must not wait on each other for it.
    environment = {**os.environ, "TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", _ONE_INTER_OP_THREAD], env=environment, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.splitlines()[-1]) == [3, 6, 9]


def test_each_step_pushes_its_loss_and_the_epoch_logs_carry_the_rule_in_force(server) -> None:
    pushed: list[float | None] = []
    push = server.coordinator.push

    def recording(*args, **kwargs):
        pushed.append(kwargs.get("loss"))
        return push(*args, **kwargs)

    server.coordinator.push = recording
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    model = _model(strategy, keras.optimizers.SGD, learning_rate=0.5, momentum=0.5)
    running: list[float] = []
    keeper = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: running.append(logs["loss"]))
    history = model.fit(*_data(), batch_size=32, epochs=2, verbose=0, callbacks=[keeper])
    # Keras' logs hold each epoch's running mean: batch k's loss is what it added.
    losses = [
        (k + 1) * running[i] - k * running[i - 1] if k else running[i]
        for i, k in enumerate([0, 1, 2] * 2)
    ]
    np.testing.assert_allclose(pushed, losses, rtol=1e-5)
    # One group: the compiled rule, nothing added.
    assert history.history["explicit_momentum"] == [0.5, 0.5]
    assert history.history["implicit_momentum"] == [0.0, 0.0]
    assert history.history["learning_rate_in_force"] == [0.5, 0.5]
    assert history.history["step_share"] == [1.0, 1.0]
    assert server.coordinator.hyperparameters().compensate_asynchrony


def test_compensation_can_be_turned_off_by_the_strategy(server) -> None:
    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)), compensate_asynchrony=False)
    model = _model(strategy, keras.optimizers.SGD, learning_rate=0.5, momentum=0.5)
    model.fit(*_data(), batch_size=32, epochs=1, verbose=0)
    assert not server.coordinator.hyperparameters().compensate_asynchrony


def test_several_steps_per_execution_read_each_batch_once_as_the_step_before_chose_it(server) -> None:
    # Each step's exchange chooses the next step's batch: a call of several steps reads
    # each of them after the step before it, as Keras' loop over a dataset would not.
    read: list[list[int]] = []
    ends: list[int] = []

    def record(rows: np.ndarray) -> np.ndarray:
        read.append(np.rint(rows[:, 0] * 100).astype(int).tolist())
        return rows

    strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))
    with strategy.scope():
        inputs = keras.Input((1,))
        seen = keras.layers.Lambda(
            lambda t: tf.ensure_shape(tf.numpy_function(record, [t], tf.float32, stateful=True), t.shape),
            output_shape=(1,),
        )(inputs)
        model = keras.Model(inputs, keras.layers.Dense(1)(seen))
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=4)
    x = (np.arange(80, dtype=np.float32) / 100)[:, None]
    calls = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: ends.append(batch))
    history = model.fit(x, np.zeros_like(x), batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[calls])
    assert model.steps_per_execution == 4
    assert history.history["model_version"] == [10, 20]
    assert read == [list(range(start, start + 8)) for start in range(0, 80, 8)] * 2
    # Three calls an epoch (4, 4 and 2 steps), each ending at Keras' last step of the call.
    assert ends == [3, 7, 11] * 2


def _fine_tuned(
    strategy: tf.distribute.Strategy, recompile: bool
) -> tuple[keras.Model, list[keras.callbacks.History], np.ndarray]:
    """keras-io's transfer learning: a frozen base under a new head, then the base
    unfrozen (and the model recompiled, with a lower rate, where `recompile`)."""
    keras.utils.set_random_seed(3)
    with strategy.scope():
        base = keras.layers.Dense(4, activation="relu", name="base")
        base.trainable = False
        model = keras.Sequential([keras.Input((4,)), base, keras.layers.Dense(3, activation="softmax")], name="tuned")
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    x, y = _data()
    histories = [model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)]
    frozen = keras.ops.convert_to_numpy(base.kernel)
    base.trainable = True
    if recompile:
        with strategy.scope():
            model.compile(optimizer=keras.optimizers.Adam(0.001), loss="sparse_categorical_crossentropy")
    histories.append(model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0))
    return model, histories, frozen


@pytest.mark.parametrize("recompile", [True, False], ids=["recompiled", "not-recompiled"])
def test_a_later_fit_that_trains_other_variables_trains_them_as_keras_does(server, recompile: bool) -> None:
    plain, plain_histories, _ = _fine_tuned(tf.distribute.get_strategy(), recompile)
    model, histories, frozen = _fine_tuned(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))), recompile)
    for ours, theirs in zip(histories, plain_histories):
        np.testing.assert_allclose(ours.history["loss"], theirs.history["loss"], rtol=1e-5)
    for ours, theirs in zip(model.weights, plain.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs), atol=1e-5)
    # The base trained only where Keras trains it: after a recompile.
    assert np.array_equal(frozen, keras.ops.convert_to_numpy(model.get_layer("base").kernel)) != recompile
    held = ParameterServerClient([server.address]).pull().weights
    assert set(held) == {v.path for v in model.trainable_variables}
    for variable in model.trainable_variables:
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), held[variable.path])


def test_a_first_fit_finding_other_variables_on_the_servers_fails_rather_than_replace_them(server) -> None:
    # The servers resumed another model (a reused log dir's checkpoint, say).
    ParameterServerClient([server.address]).init_model({"other/kernel": np.ones(2, np.float32)}, omnikeras.Hyperparameters(0.1))
    model = _model(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))), keras.optimizers.SGD)
    with pytest.raises(ValueError, match=r"gone: \['other/kernel'\].*Launch afresh"):
        model.fit(*_data(), batch_size=32, epochs=1, verbose=0)
    np.testing.assert_array_equal(ParameterServerClient([server.address]).pull().weights["other/kernel"], [1, 1])


class _TwoParts(keras.Model):
    """keras-io's VAE and GANs: no `call`, a train step of its own over sub-models, and
    (`own_optimizer`) a GAN's optimizers of its own."""

    def __init__(self, own_optimizer: bool = False) -> None:
        super().__init__()
        self.encoder = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        self.decoder = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
        self.own_optimizer = keras.optimizers.SGD(0.1) if own_optimizer else None

    def train_step(self, data: tf.Tensor) -> dict:
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self.decoder(self.encoder(data)) - data))
        optimizer = self.own_optimizer or self.optimizer
        optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
        return {"reconstruction": loss}


def _two_parts(strategy: tf.distribute.Strategy, own_optimizer: bool = False) -> keras.Model:
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = _TwoParts(own_optimizer)
        model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


def test_a_model_without_call_trains_through_its_own_train_step_as_in_keras(server) -> None:
    x, _ = _data()
    plain = _two_parts(tf.distribute.get_strategy())
    expected = plain.fit(x, batch_size=32, epochs=3, shuffle=False, verbose=0).history["reconstruction"]
    model = _two_parts(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))))
    history = model.fit(x, batch_size=32, epochs=3, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["reconstruction"], expected, rtol=1e-5)
    assert history.history["reconstruction"][-1] < history.history["reconstruction"][0]
    for ours, theirs in zip(model.weights, plain.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs), atol=1e-5)


def test_a_train_step_with_an_optimizer_of_its_own_is_refused(server) -> None:
    model = _two_parts(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))), own_optimizer=True)
    with pytest.raises(ValueError, match=r"optimizer other than the model's \(sgd\w*, not adam\w*\).*outside the strategy's scope"):
        model.fit(_data()[0], batch_size=32, epochs=1, verbose=0)


def test_gradients_applied_outside_fit_are_refused_with_what_to_do(server) -> None:
    model = _model(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))), keras.optimizers.SGD)
    before = [keras.ops.convert_to_numpy(w) for w in model.weights]
    x, y = _data()
    with tf.GradientTape() as tape:
        loss = keras.losses.sparse_categorical_crossentropy(y, model(x))
    gradients = tape.gradient(loss, model.trainable_variables)
    with pytest.raises(ValueError, match="trains through model.fit.*custom training loop"):
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    for was, variable in zip(before, model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), was)
    # The model still trains through fit.
    assert model.fit(x, y, batch_size=32, epochs=1, verbose=0).history["model_version"] == [3]


def _frozen_base(strategy: tf.distribute.Strategy) -> keras.Model:
    with strategy.scope():
        base = keras.layers.Dense(3, name="frozen_base", trainable=False)
        model = keras.Sequential([keras.Input((4,)), base, keras.layers.Dense(2, activation="softmax", name="head")], name="on_frozen")
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def test_a_chief_resuming_takes_the_frozen_weights_the_servers_kept_and_one_starting_puts_its_own(server) -> None:
    first = _frozen_base(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))))
    first.fit(*_data(), batch_size=32, epochs=1, verbose=0)
    kept = keras.ops.convert_to_numpy(first.get_layer("frozen_base").kernel)
    held = ParameterServerClient([server.address]).frozen_weights()
    assert list(held) == [v.path for v in first.get_layer("frozen_base").weights]
    np.testing.assert_array_equal(held[first.get_layer("frozen_base").kernel.path], kept)

    # A restarted chief: its own base, initialised otherwise, gives way to the one trained on.
    resumed = _frozen_base(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))))
    assert not np.array_equal(keras.ops.convert_to_numpy(resumed.get_layer("frozen_base").kernel), kept)
    resumed.fit(*_data(), batch_size=32, epochs=1, verbose=0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(resumed.get_layer("frozen_base").kernel), kept)


class _BatchCounter(keras.callbacks.Callback):
    """The batches each hook saw, epoch by epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.begun: list[list[int]] = []
        self.ended: list[list[int]] = []

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.begun.append([])
        self.ended.append([])

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.begun[-1].append(batch)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.ended[-1].append(batch)


def _plain_and_ours(server: ParameterServer) -> dict[str, tf.distribute.Strategy]:
    return {"plain": tf.distribute.get_strategy(), "ours": omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,)))}


def test_callbacks_see_each_epoch_s_steps_as_in_plain_keras(server) -> None:
    counted = {}
    for name, strategy in _plain_and_ours(server).items():
        counter = _BatchCounter()
        model = _model(strategy, keras.optimizers.SGD, learning_rate=0.1)
        model.fit(*_data(), batch_size=32, epochs=3, verbose=0, callbacks=[counter])
        counted[name] = (counter.begun, counter.ended)
    # No step begun only to find the end of the epoch's data.
    assert counted["ours"] == counted["plain"] == ([[0, 1, 2]] * 3, [[0, 1, 2]] * 3)


class _OneCycle(keras.callbacks.Callback):
    """A learning rate set batch by batch, as a one-cycle policy sets it."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.model.optimizer.learning_rate = [0.05, 0.4, 0.1, 0.02][self.step % 4]
        self.step += 1


def test_a_learning_rate_a_callback_sets_batch_by_batch_applies_from_that_batch(server) -> None:
    weights = {}
    for name, strategy in _plain_and_ours(server).items():
        keras.utils.set_random_seed(1)
        model = _model(strategy, keras.optimizers.SGD, learning_rate=0.1, momentum=0.5)
        model.fit(*_data(), batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[_OneCycle()])
        weights[name] = [keras.ops.convert_to_numpy(w) for w in model.weights]
    for expected, got in zip(weights["plain"], weights["ours"], strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


class _Linear(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule of the user's own: the rate names the step it was evaluated at."""

    def __call__(self, step):
        return 1e-3 * (keras.ops.cast(step, "float32") + 1)


def _on_own_schedule(server: ParameterServer) -> keras.Model:
    with omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))).scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3, activation="softmax", name="out")], name="on_own_schedule"
        )
        model.compile(optimizer=keras.optimizers.SGD(_Linear()), loss="sparse_categorical_crossentropy")
    return model


def test_a_chief_resuming_evaluates_its_own_schedule_at_the_servers_count(server) -> None:
    first = _on_own_schedule(server)
    first.fit(*_data(), batch_size=32, epochs=2, verbose=0)
    assert server.coordinator.model.iterations == 6

    # A restarted chief's optimizer counts from 0; its first step is the servers' seventh.
    resumed = _on_own_schedule(server)
    resumed.fit(*_data(), batch_size=32, steps_per_epoch=1, epochs=1, verbose=0)
    assert server.coordinator.stats().learning_rate_in_force == pytest.approx(1e-3 * 7)
    assert int(keras.ops.convert_to_numpy(resumed.optimizer.iterations)) == 7


def test_validation_builds_its_dataset_once_an_epoch_not_at_every_step(server, monkeypatch) -> None:
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    built = []
    original = ArrayDataAdapter.get_tf_dataset

    def counted(adapter: ArrayDataAdapter) -> tf.data.Dataset:
        built.append(adapter)
        return original(adapter)

    monkeypatch.setattr(ArrayDataAdapter, "get_tf_dataset", counted)
    model = _model(omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,))), keras.optimizers.SGD)
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=2, validation_data=(x, y), verbose=0)
    # 12 training steps and 12 validation steps an epoch: Keras builds validation's dataset
    # as its iterator is made, each epoch, and no step asks for it again.
    assert len(built) <= 2


class _SharesRead(keras.callbacks.Callback):
    """Notes, as each step begins, whether the share it reads is one read ahead."""

    def __init__(self, worker: ClusterWorker, read_ahead: list[object]) -> None:
        super().__init__()
        self.worker = worker
        self.read_ahead = read_ahead
        self.ahead: list[bool] = []

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        share = self.worker._share
        self.ahead.append(any(share is ahead for ahead in self.read_ahead))


@pytest.mark.parametrize("shared_memory", [True, False], ids=["shared-memory", "grpc"])
def test_steps_read_the_shares_read_ahead_and_train_the_same_bits_as_without(monkeypatch, shared_memory: bool) -> None:
    trained, read_ahead_by_run = [], []
    for read_ahead in (True, False):
        with _fresh_server() as server:
            keras.utils.set_random_seed(0)
            strategy = omnikeras.GroupedAsyncStrategy(WorkerConfig((server.address,), shared_memory=shared_memory))
            # The shares read ahead, as the feed is handed them.
            shares_ahead: list[object] = []
            prepare = data.ShareFeed.prepare
            monkeypatch.setattr(data.ShareFeed, "prepare", lambda feed, share: (shares_ahead.append(share), prepare(feed, share)))
            if not read_ahead:
                monkeypatch.setattr(strategy.worker, "_read_share_ahead", lambda: None)
            model = _model(strategy, keras.optimizers.SGD, learning_rate=0.5, momentum=0.5)
            shares_read = _SharesRead(strategy.worker, shares_ahead)
            model.fit(*_data(), batch_size=32, epochs=3, verbose=0, callbacks=[shares_read])
            trained.append(model.get_weights())
            read_ahead_by_run.append(shares_read.ahead)
            monkeypatch.undo()
    # Each step after the first read the share read ahead while the server worked.
    assert read_ahead_by_run[0] == [False] + [True] * 8
    assert read_ahead_by_run[1] == [False] * 9
    for with_read_ahead, without in zip(*trained):
        np.testing.assert_array_equal(with_read_ahead, without)
