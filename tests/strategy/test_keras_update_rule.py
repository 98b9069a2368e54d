"""A Keras optimizer's settings become the server's rule, or a clear error."""

from typing import Any

import keras
import pytest

from omnikeras.parameter_server.clipping import Clipping
from omnikeras.parameter_server.constraints import Constraint
from omnikeras.parameter_server.schedules import LearningRateSchedule
from omnikeras.strategy.fit import _check_one_learning_rate_owner
from omnikeras.strategy.update_rule import server_update_rule, uses_schedule
from omnikeras.tuner import OmnivoreCallback


def _model(optimizer: keras.optimizers.Optimizer, constraint: Any = None) -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, kernel_constraint=constraint)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def test_schedule_weight_decay_and_its_exclusions_reach_the_server() -> None:
    schedule = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=100)
    optimizer = keras.optimizers.SGD(schedule, momentum=0.8, nesterov=True, weight_decay=0.004)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    model = _model(optimizer)
    rule = server_update_rule(optimizer, model.trainable_variables)
    assert (rule.optimizer, rule.momentum, rule.settings, rule.weight_decay) == ("SGD", 0.8, {"nesterov": 1.0}, 0.004)
    assert rule.learning_rate_schedule == LearningRateSchedule("CosineDecay", schedule.get_config())
    assert rule.learning_rate_at(100) == pytest.approx(0.0)
    bias = next(v.path for v in model.trainable_variables if "bias" in v.path)
    assert rule.no_weight_decay == {bias}


def test_a_constant_rate_reads_back_as_written() -> None:
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    rule = server_update_rule(optimizer, _model(optimizer).trainable_variables)
    assert (rule.learning_rate, rule.learning_rate_schedule, rule.weight_decay) == (0.01, None, 0.0)


def test_an_adam_family_optimizer_sends_its_beta_1_as_the_momentum_and_the_rest_as_settings() -> None:
    optimizer = keras.optimizers.AdamW(0.002, beta_1=0.85, beta_2=0.95, epsilon=1e-6, amsgrad=True)
    rule = server_update_rule(keras.optimizers.LossScaleOptimizer(optimizer), _model(optimizer).trainable_variables)
    assert (rule.optimizer, rule.learning_rate, rule.momentum) == ("AdamW", 0.002, 0.85)
    assert rule.settings == {"beta_2": 0.95, "epsilon": 1e-6, "amsgrad": 1.0}
    assert rule.weight_decay == pytest.approx(0.004)


def test_an_optimizer_without_momentum_sends_none() -> None:
    optimizer = keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.5)
    rule = server_update_rule(optimizer, _model(optimizer).trainable_variables)
    assert (rule.optimizer, rule.momentum, rule.settings) == ("Adagrad", 0.0, {"initial_accumulator_value": 0.5, "epsilon": 1e-7})


def test_muon_sends_keras_choice_of_its_adamw_variables_and_its_settings() -> None:
    optimizer = keras.optimizers.Muon(0.01, momentum=0.9, weight_decay=None, adam_weight_decay=0.01, rms_rate=None)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    model = keras.Sequential(
        [keras.Input((4,), dtype="int32"), keras.layers.Embedding(10, 3), keras.layers.Flatten(), keras.layers.Dense(2)]
    )
    model.compile(optimizer=optimizer, loss="mse")
    rule = server_update_rule(optimizer, model.trainable_variables)
    paths = {v.name: v.path for v in model.trainable_variables}
    assert (rule.optimizer, rule.momentum, rule.weight_decay) == ("Muon", 0.9, 0.0)
    # The dense layer's matrix takes Muon's update; the embeddings and the bias take AdamW's.
    assert rule.adamw_variables == {paths["embeddings"], paths["bias"]}
    # Keras' None: no rescaling.
    assert rule.settings["rms_rate"] == 0.0
    # The AdamW variables decay at their own rate, but the excluded bias.
    assert rule.no_weight_decay == {paths["bias"]}
    decays = {name: rule.weight_decay_of(path) for name, path in paths.items()}
    assert decays == {"embeddings": 0.01, "kernel": 0.0, "bias": 0.0}


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return keras.ops.minimum(0.1, 0.01 * (keras.ops.cast(step, "float32") + 1))


class SubclassedDecay(keras.optimizers.schedules.ExponentialDecay):
    pass


@pytest.mark.parametrize(
    "optimizer, rate",
    [
        (lambda: keras.optimizers.SGD(WarmupSchedule()), 0.01),
        (lambda: keras.optimizers.SGD(SubclassedDecay(0.1, 10, 0.5)), 0.1),
        (lambda: keras.optimizers.Adam(lambda: 0.25), 0.25),
        (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.AdamW(WarmupSchedule())), 0.01),
    ],
    ids=["own schedule", "subclassed built-in", "function", "loss scaled"],
)
def test_a_rate_only_tensorflow_can_evaluate_is_left_to_the_workers(optimizer, rate: float) -> None:
    optimizer = optimizer()
    rule = server_update_rule(optimizer, _model(optimizer).trainable_variables)
    assert rule.learning_rate_from_workers
    assert rule.learning_rate_schedule is None
    # The rate until the first push: the schedule's at the optimizer's iteration count.
    assert rule.learning_rate == pytest.approx(rate)
    assert uses_schedule(optimizer)


@pytest.mark.parametrize(
    "optimizer, constraint, error, message",
    [
        (keras.optimizers.SGD(0.1), lambda w: w, ValueError, "kernel's constraint .* is not supported"),
        (keras.optimizers.Muon(rms_rate=0), None, ValueError, "rms_rate=0"),
    ],
)
def test_what_the_server_cannot_apply_is_refused_by_name(optimizer, constraint, error, message) -> None:
    model = _model(optimizer, constraint)
    with pytest.raises(error, match=message):
        server_update_rule(optimizer, model.trainable_variables)


def test_keras_built_in_constraints_reach_the_server_with_the_workers_epsilon() -> None:
    model = _model(keras.optimizers.SGD(0.1), keras.constraints.MaxNorm(3, axis=[0]))
    kernel = model.layers[0].kernel
    keras.backend.set_epsilon(1e-6)
    try:
        rule = server_update_rule(model.optimizer, model.trainable_variables)
    finally:
        keras.backend.set_epsilon(1e-7)
    assert rule.constraints == {kernel.path: Constraint("MaxNorm", {"max_value": 3, "axis": [0], "epsilon": 1e-6})}
    assert rule.constraints[kernel.path].epsilon == 1e-6


def test_a_moving_average_of_the_weights_reaches_the_server() -> None:
    averaged = _model(keras.optimizers.Adam(use_ema=True, ema_momentum=0.95, ema_overwrite_frequency=10))
    rule = server_update_rule(averaged.optimizer, averaged.trainable_variables)
    assert (rule.ema_momentum, rule.ema_overwrite_frequency) == (0.95, 10)
    # Keras reads the frequency only with use_ema.
    plain = _model(keras.optimizers.Adam(ema_overwrite_frequency=10))
    rule = server_update_rule(plain.optimizer, plain.trainable_variables)
    assert (rule.ema_momentum, rule.ema_overwrite_frequency) == (None, 0)


def test_the_server_clips_the_gradients_only_where_they_accumulate() -> None:
    accumulated = _model(keras.optimizers.SGD(0.1, gradient_accumulation_steps=4, global_clipnorm=2.0))
    rule = server_update_rule(accumulated.optimizer, accumulated.trainable_variables)
    assert (rule.gradient_accumulation_steps, rule.clipping) == (4, Clipping(global_clipnorm=2.0))
    # Without accumulation each worker clips its own gradients, as each replica does.
    clipped = _model(keras.optimizers.SGD(0.1, global_clipnorm=2.0))
    assert not server_update_rule(clipped.optimizer, clipped.trainable_variables).clipping


def test_the_tuner_owns_the_learning_rate() -> None:
    constant = _model(keras.optimizers.SGD(0.1))
    tuner = OmnivoreCallback(target_loss=0.1)
    _check_one_learning_rate_owner(constant, [tuner])
    _check_one_learning_rate_owner(constant, [keras.callbacks.ReduceLROnPlateau()])
    with pytest.raises(ValueError, match="OmnivoreCallback tunes the learning rate.*LearningRateScheduler"):
        _check_one_learning_rate_owner(constant, [tuner, keras.callbacks.LearningRateScheduler(lambda e, r: r)])
    scheduled = _model(keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)))
    with pytest.raises(ValueError, match="ExponentialDecay schedule"):
        _check_one_learning_rate_owner(scheduled, [tuner])
    own = _model(keras.optimizers.SGD(WarmupSchedule()))
    with pytest.raises(ValueError, match="WarmupSchedule schedule"):
        _check_one_learning_rate_owner(own, [tuner])
