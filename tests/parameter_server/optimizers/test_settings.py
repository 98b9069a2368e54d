"""An optimizer's settings are checked where the server receives them, and travel whole."""

import pytest

from omnikeras.parameter_server.errors import InvalidArgument
from omnikeras.parameter_server.optimizers import optimizer_named
from omnikeras.parameter_server.update_rule import Hyperparameters
from omnikeras.v1 import parameter_server_pb2 as pb


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"optimizer": "Adamm"}, "no optimizer 'Adamm'; it applies SGD, Adam"),
        ({"optimizer": "Adam", "settings": {"rho": 0.9}}, "Adam has no setting rho"),
        ({"optimizer": "Adam", "settings": {"amsgrad": 0.5}}, "amsgrad is a flag"),
        ({"optimizer": "RMSprop", "settings": {"epsilon": float("nan")}}, "epsilon must be finite"),
        ({"optimizer": "Adagrad", "momentum": 0.9}, "Adagrad has no momentum-like setting"),
        ({"optimizer": "Muon", "settings": {"ns_steps": 2.5}}, "ns_steps counts iterations"),
        ({"optimizer": "Muon", "settings": {"adam_weight_decay": -0.1}}, "adam_weight_decay must be 0 or positive"),
        ({"optimizer": "Adam", "adamw_variables": frozenset({"bias"})}, "adamw_variables are Muon's choice"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Hyperparameters(**kwargs)


def test_unset_settings_take_keras_defaults() -> None:
    assert optimizer_named("Adam", {"beta_2": 0.99}).settings == {"beta_2": 0.99, "epsilon": 1e-7, "amsgrad": 0.0}


def test_the_optimizer_and_its_settings_travel_in_the_proto() -> None:
    rule = Hyperparameters(0.002, momentum=0.85, optimizer="AdamW", settings={"amsgrad": 1.0}, weight_decay=0.01)
    assert Hyperparameters.from_proto(rule.to_proto()) == rule
    # Muon's choice of the variables it leaves to AdamW travels with it.
    muon = Hyperparameters(0.01, momentum=0.95, optimizer="Muon", adamw_variables=frozenset({"dense/bias"}))
    assert Hyperparameters.from_proto(muon.to_proto()) == muon
    # Older clients and checkpoints name SGD's Nesterov momentum in a field of its own.
    older = Hyperparameters.from_proto(pb.Hyperparameters(learning_rate=0.1, momentum=0.9, nesterov=True))
    assert (older.optimizer, older.settings) == ("SGD", {"nesterov": 1.0})
