"""A Keras optimizer's settings as the server's update rule, or a clear error naming what
the server cannot apply: nothing the user set is dropped silently. Batch normalization's
statistics are held by the server too, combined across workers.

A learning rate only TensorFlow can evaluate (a schedule of the user's own, or a rate
given as a function) is evaluated by the worker, as Keras evaluates it, at the servers'
iteration count, and goes to the server with each push (`rate_from_worker`).

Gradient accumulation (`gradient_accumulation_steps`) is the server's: each worker pushes
every step's gradients, and the server updates the weights every so many group steps with
their mean (see `ModelState`), which it clips as Keras does.

What stays on the worker without gradient accumulation: gradient clipping (`clipnorm`,
`clipvalue`, `global_clipnorm`)
and a `LossScaleOptimizer`'s scaling, which Keras applies to each worker's gradients
before they are pushed (a group combines clipped, unscaled gradients, and skips its step
where a member's overflowed: see `keras_hooks`); the optimizer it wraps runs on the server.
"""

import functools
from collections.abc import Sequence

import keras

from omnikeras.parameter_server import Hyperparameters
from omnikeras.parameter_server.clipping import Clipping
from omnikeras.parameter_server.constraints import SETTINGS, Constraint
from omnikeras.parameter_server.optimizers import OPTIMIZERS, Optimizer
from omnikeras.parameter_server.optimizers.muon import Muon
from omnikeras.parameter_server.schedules import FORMULAS, LearningRateSchedule

# Muon's settings that Keras lets be None, which the server reads as 0: `adam_weight_decay`
# (no decay) and `rms_rate` (the update not rescaled).
_NONE_AS_ZERO = ("adam_weight_decay", "rms_rate")


def server_update_rule(
    optimizer: keras.optimizers.Optimizer,
    variables: Sequence[keras.Variable],
    statistics: Sequence[keras.Variable] = (),
) -> Hyperparameters:
    """The server's rule for `optimizer` over the model's trainable `variables` and its
    `statistics` (see `model_statistics`).

    Raises:
        ValueError: For settings the server does not apply: a constraint other than
            Keras' built-in ones, Muon's `rms_rate` of 0.
        TypeError: For an optimizer the server does not apply.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    server = _server_optimizer(optimizer)
    weight_decay = float(optimizer.weight_decay or 0.0)
    from_workers = rate_from_worker(optimizer)
    settings = {key: _setting(optimizer, key) for key in server.defaults}
    # Muon decays the variables it leaves to AdamW by a rate of their own.
    decays = weight_decay or settings.get("adam_weight_decay", 0.0)
    return Hyperparameters(
        learning_rate=learning_rate_of(optimizer),
        momentum=float(getattr(optimizer, server.momentum_setting)) if server.momentum_setting else 0.0,
        optimizer=server.name,
        settings=settings,
        learning_rate_schedule=None if from_workers else _schedule(optimizer),
        weight_decay=weight_decay,
        no_weight_decay=frozenset(v.path for v in variables if decays and not optimizer._use_weight_decay(v)),
        statistics=frozenset(v.path for v in statistics),
        # Keras' own choice, by the paths and patterns only the worker has.
        adamw_variables=frozenset(v.path for v in variables if server is Muon and optimizer._should_use_adamw(v)),
        learning_rate_from_workers=from_workers,
        constraints={v.path: server_constraint(v) for v in variables if v.constraint is not None},
        ema_momentum=float(optimizer.ema_momentum) if optimizer.use_ema else None,
        ema_overwrite_frequency=int(optimizer.ema_overwrite_frequency or 0) if optimizer.use_ema else 0,
        gradient_accumulation_steps=int(optimizer.gradient_accumulation_steps or 0),
        # Keras clips the accumulated mean, which only the server sees.
        clipping=server_clipping(optimizer) if optimizer.gradient_accumulation_steps else Clipping(),
    )


def server_constraint(variable: keras.Variable) -> Constraint:
    """The variable's constraint as the server applies it: one of Keras' built-in ones.

    Raises:
        ValueError: For any other constraint, which only the worker's TensorFlow could
            apply to weights the server holds.
    """
    constraint = variable.constraint
    name = type(constraint).__name__
    if name not in SETTINGS or type(constraint) is not getattr(keras.constraints, name):
        raise ValueError(
            f"{variable.path}'s constraint {constraint!r} is not supported under GroupedAsyncStrategy: the "
            f"parameter server updates the weights and applies Keras' {', '.join(SETTINGS)} after each "
            "update; use one of those, or train without the constraint"
        )
    config = constraint.get_config()
    if name != "NonNeg":
        config["epsilon"] = keras.backend.epsilon()
    return Constraint(name, config)


def server_clipping(optimizer: keras.optimizers.Optimizer) -> Clipping:
    """The optimizer's gradient clipping, for the server to apply."""
    return Clipping(
        float(optimizer.clipnorm or 0.0), float(optimizer.global_clipnorm or 0.0), float(optimizer.clipvalue or 0.0)
    )


def _setting(optimizer: keras.optimizers.Optimizer, key: str) -> float:
    """The setting `key` as the server takes it: a number (see `_NONE_AS_ZERO`)."""
    value = getattr(optimizer, key)
    if value is None and key in _NONE_AS_ZERO:
        return 0.0
    if key == "rms_rate" and value == 0:
        raise ValueError(
            "Muon's rms_rate=0 would leave every matrix where it is, and the parameter server reads 0 "
            "as None (no rescaling): compile with rms_rate=None or a positive rate"
        )
    return float(value)


def _server_optimizer(optimizer: keras.optimizers.Optimizer) -> type[Optimizer]:
    name = type(optimizer).__name__
    server = OPTIMIZERS.get(name)
    if server is not None and type(optimizer) is getattr(keras.optimizers, name):
        return server
    applied = ", ".join(OPTIMIZERS)
    raise TypeError(
        f"GroupedAsyncStrategy runs the optimizer on the parameter server, which applies Keras' "
        f"{applied}; {type(optimizer).__module__}.{type(optimizer).__qualname__} is not one of them: "
        "compile with one of those"
    )


def model_statistics(model: keras.Model) -> list[keras.Variable]:
    """The variables the model trains itself, which the server combines across workers:
    the moving means and variances of its batch-normalization layers."""
    return [
        variable
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, keras.layers.BatchNormalization)
        for variable in layer.non_trainable_variables
    ]


def uses_schedule(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether the optimizer's rate follows a schedule, the server's or the worker's."""
    return isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule) or rate_from_worker(
        optimizer
    )


def rate_from_worker(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether the worker evaluates the optimizer's learning rate, which only TensorFlow
    can: a schedule other than Keras' built-in ones, or a rate given as a function."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    rate = optimizer._learning_rate
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        name = type(rate).__name__
        return name not in FORMULAS or type(rate) is not getattr(keras.optimizers.schedules, name)
    return callable(rate) and not isinstance(rate, keras.Variable)


def step_counter(optimizer: keras.optimizers.Optimizer) -> keras.Variable:
    """The optimizer's count of steps, which its learning rate reads: Keras'
    `optimizer.iterations`, except under gradient accumulation, where that counts the
    updates only."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer._iterations


def learning_rate_of(optimizer: keras.optimizers.Optimizer) -> float:
    """The optimizer's current learning rate, as the user wrote it."""
    return as_written(float(keras.ops.convert_to_numpy(optimizer.learning_rate)))


# The chief reads the rate at every step, and it seldom changes: formatting it cost 13 µs.
@functools.lru_cache(maxsize=8)
def as_written(rate: float) -> float:
    """A learning rate read back from its float32 variable, as the user wrote it."""
    # 0.01 reads back as 0.009999999776: seven significant digits give back the number.
    return float(f"{rate:.7g}")


def _schedule(optimizer: keras.optimizers.Optimizer) -> LearningRateSchedule | None:
    """The optimizer's schedule where it is one of Keras' built-in ones, which the server
    evaluates."""
    rate = optimizer._learning_rate
    if not isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return None
    return LearningRateSchedule(type(rate).__name__, rate.get_config())

