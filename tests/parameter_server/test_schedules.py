"""The server's schedules give Keras' learning rates at every iteration."""

import numpy as np
import pytest

from omnikeras.parameter_server.errors import InvalidArgument
from omnikeras.parameter_server.schedules import FORMULAS, LearningRateSchedule
from omnikeras.v1 import parameter_server_pb2 as pb

keras = pytest.importorskip("keras")
schedules = keras.optimizers.schedules

KERAS_SCHEDULES = [
    schedules.ExponentialDecay(0.1, decay_steps=7, decay_rate=0.8),
    schedules.ExponentialDecay(0.1, decay_steps=7, decay_rate=0.8, staircase=True),
    schedules.PiecewiseConstantDecay([10, 25, 40], [0.1, 0.05, 0.01, 0.001]),
    schedules.PolynomialDecay(0.1, decay_steps=30, end_learning_rate=0.001, power=2.0),
    schedules.PolynomialDecay(0.1, decay_steps=13, end_learning_rate=0.001, power=0.5, cycle=True),
    schedules.InverseTimeDecay(0.1, decay_steps=5, decay_rate=0.5),
    schedules.InverseTimeDecay(0.1, decay_steps=5, decay_rate=0.5, staircase=True),
    schedules.CosineDecay(0.1, decay_steps=40, alpha=0.1),
    schedules.CosineDecay(0.01, decay_steps=30, warmup_target=0.1, warmup_steps=10),
    schedules.CosineDecayRestarts(0.1, first_decay_steps=8),
    schedules.CosineDecayRestarts(0.1, first_decay_steps=8, t_mul=1.0, m_mul=0.5, alpha=0.05),
]


def test_every_built_in_schedule_is_covered() -> None:
    assert {type(s).__name__ for s in KERAS_SCHEDULES} == set(FORMULAS)


@pytest.mark.parametrize("keras_schedule", KERAS_SCHEDULES, ids=lambda s: type(s).__name__)
def test_matches_keras_at_every_iteration(keras_schedule) -> None:
    schedule = LearningRateSchedule(type(keras_schedule).__name__, keras_schedule.get_config())
    # Through the wire format, as the server receives it.
    schedule = LearningRateSchedule.from_proto(schedule.to_proto())
    iterations = range(0, 100)
    expected = [float(keras.ops.convert_to_numpy(keras_schedule(i))) for i in iterations]
    np.testing.assert_allclose([schedule(i) for i in iterations], expected, rtol=1e-5)


def test_an_unknown_schedule_or_a_bad_configuration_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="'WarmupThenDecay' is not one of Keras' built-in schedules"):
        LearningRateSchedule("WarmupThenDecay", {})
    with pytest.raises(InvalidArgument, match="ExponentialDecay configuration"):
        LearningRateSchedule("ExponentialDecay", {"initial_learning_rate": 0.1})
    with pytest.raises(InvalidArgument, match="not JSON"):
        LearningRateSchedule.from_proto(pb.LearningRateSchedule(name="ExponentialDecay", config_json="{"))
