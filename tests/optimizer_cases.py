"""One Keras optimizer of each kind the server applies, with a learning-rate schedule and,
where it has one, weight decay: the cases the parity tests run.

Their models have a layer named "output": Muon's `exclude_layers` case leaves it to AdamW,
as Keras advises for the output layer."""

from collections.abc import Callable

import keras


def _decay() -> keras.optimizers.schedules.LearningRateSchedule:
    return keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=50, decay_rate=0.5)


def _cosine_with_warmup() -> keras.optimizers.schedules.LearningRateSchedule:
    return keras.optimizers.schedules.CosineDecay(0.0, decay_steps=150, warmup_target=0.01, warmup_steps=50)


KERAS_OPTIMIZERS: dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "SGD nesterov": lambda: keras.optimizers.SGD(_decay(), momentum=0.9, nesterov=True, weight_decay=0.01),
    "Adam": lambda: keras.optimizers.Adam(_decay(), weight_decay=0.01),
    "Adam amsgrad": lambda: keras.optimizers.Adam(_decay(), beta_1=0.8, beta_2=0.99, epsilon=1e-6, amsgrad=True),
    "AdamW cosine warmup": lambda: keras.optimizers.AdamW(_cosine_with_warmup(), weight_decay=0.05),
    "Adamax": lambda: keras.optimizers.Adamax(_decay(), beta_1=0.85, weight_decay=0.01),
    "Nadam": lambda: keras.optimizers.Nadam(_decay(), weight_decay=0.01),
    "RMSprop": lambda: keras.optimizers.RMSprop(_decay(), weight_decay=0.01),
    "RMSprop centered momentum": lambda: keras.optimizers.RMSprop(_decay(), rho=0.8, momentum=0.5, centered=True),
    "Adagrad": lambda: keras.optimizers.Adagrad(_decay(), initial_accumulator_value=0.2, weight_decay=0.01),
    "Adadelta": lambda: keras.optimizers.Adadelta(1.0, rho=0.9, weight_decay=0.01),
    "Lamb": lambda: keras.optimizers.Lamb(_decay(), beta_1=0.85, weight_decay=0.01),
    "Adafactor": lambda: keras.optimizers.Adafactor(_decay(), clip_threshold=0.5, weight_decay=0.01),
    "Ftrl": lambda: keras.optimizers.Ftrl(
        0.05, l1_regularization_strength=0.001, l2_regularization_strength=0.01,
        l2_shrinkage_regularization_strength=0.01, beta=0.1,
    ),
    "ScheduleFreeAdamW": lambda: keras.optimizers.ScheduleFreeAdamW(_decay(), warmup_steps=20, weight_decay=0.01),
    "Lion": lambda: keras.optimizers.Lion(_cosine_with_warmup(), beta_1=0.8, weight_decay=0.01),
    # Matrices take Muon's update; biases, batch normalization's scales (and the excluded
    # layer's kernel) take AdamW's, each with its own weight decay.
    "Muon": lambda: keras.optimizers.Muon(_decay(), weight_decay=0.01, adam_weight_decay=0.02, adam_lr_ratio=0.5),
    "Muon exclude_layers": lambda: keras.optimizers.Muon(
        _cosine_with_warmup(), exclude_layers=["output"], momentum=0.9, nesterov=False, rms_rate=None,
        adam_beta_1=0.8, adam_beta_2=0.99, epsilon=1e-6, ns_steps=3, adam_weight_decay=0.03,
    ),
}
