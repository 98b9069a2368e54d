"""The optimizers the server applies: Keras' own, one module each, by Keras class name.

    >>> from omnikeras.parameter_server.optimizers import optimizer_named
    >>> optimizer_named("Adam", {"amsgrad": 1.0}).settings["amsgrad"]
    1.0
"""

from collections.abc import Mapping

from omnikeras.parameter_server.errors import InvalidArgument
from omnikeras.parameter_server.optimizers.adadelta import Adadelta
from omnikeras.parameter_server.optimizers.adafactor import Adafactor
from omnikeras.parameter_server.optimizers.adagrad import Adagrad
from omnikeras.parameter_server.optimizers.adam import Adam, AdamW
from omnikeras.parameter_server.optimizers.adamax import Adamax
from omnikeras.parameter_server.optimizers.base import MomentumForm, Optimizer, Step
from omnikeras.parameter_server.optimizers.ftrl import Ftrl
from omnikeras.parameter_server.optimizers.lamb import Lamb
from omnikeras.parameter_server.optimizers.lion import Lion
from omnikeras.parameter_server.optimizers.muon import Muon
from omnikeras.parameter_server.optimizers.nadam import Nadam
from omnikeras.parameter_server.optimizers.rmsprop import RMSprop
from omnikeras.parameter_server.optimizers.schedule_free_adamw import ScheduleFreeAdamW
from omnikeras.parameter_server.optimizers.sgd import SGD

OPTIMIZERS: dict[str, type[Optimizer]] = {
    cls.name: cls
    for cls in (
        SGD, Adam, AdamW, Adamax, Nadam, Lamb, RMSprop, Adagrad, Adadelta, Adafactor, Ftrl, Lion, ScheduleFreeAdamW,
        Muon,
    )
}


def optimizer_named(name: str, settings: Mapping[str, float] | None = None) -> Optimizer:
    """The server's optimizer of Keras class `name`, with `settings`."""
    cls = OPTIMIZERS.get(name)
    if cls is None:
        raise InvalidArgument(f"the server has no optimizer {name!r}; it applies {', '.join(OPTIMIZERS)}")
    return cls(settings)


__all__ = ["OPTIMIZERS", "MomentumForm", "Optimizer", "Step", "optimizer_named"]
