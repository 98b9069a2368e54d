"""OmnivoreCallback's configuration and its refusals, in this process."""

import keras
import numpy as np
import pytest

import omnikeras


def test_stores_its_configuration() -> None:
    callback = omnikeras.OmnivoreCallback(target_loss=0.3, storage="runs/x.journal", study_name="s", budget=12)
    assert callback.get_config() == {
        "target_loss": 0.3,
        "storage": "runs/x.journal",
        "study_name": "s",
        "budget": 12,
        "tuning_overhead": 0.1,
        "profile": None,
        "probe_examples": 512,
    }


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"target_loss": 0.0}, "target_loss"),
        ({"target_loss": float("nan")}, "target_loss"),
        ({"target_loss": 0.3, "budget": 2}, "budget"),
        ({"target_loss": 0.3, "tuning_overhead": 1.0}, "tuning_overhead"),
        ({"target_loss": 0.3, "probe_examples": 0}, "probe_examples"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        omnikeras.OmnivoreCallback(**kwargs)


def test_needs_the_grouped_async_strategy() -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="GroupedAsyncStrategy"):
        model.fit(np.zeros((4, 2)), np.zeros(4), callbacks=[omnikeras.OmnivoreCallback(0.1)], verbose=0)
