"""omnikeras: the Omnivore optimizer for Keras and TensorFlow.

Grouped asynchronous SGD through a gRPC parameter server, for Keras models trained on a
mix of CPUs and GPUs. A training script needs one change, the strategy's scope, and runs
on a local cluster with `omnikeras launch --workers 4 --groups 2 train.py`:

```python
import keras
import omnikeras

strategy = omnikeras.GroupedAsyncStrategy()
with strategy.scope():
    model = keras.Sequential([...])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss=...)
model.fit(x_train, y_train, batch_size=64, epochs=5)
```

Add `callbacks=[omnikeras.OmnivoreCallback(target_loss=0.3)]` to `fit` and the number of
groups, the momentum and the learning rate are tuned while it runs.

The names that need TensorFlow (the strategy, the callback, the data sets) load it on
first use, so the parameter server and its client start in a fraction of a second.
"""

import importlib
from typing import Any

from omnikeras.config import WorkerConfig
from omnikeras.launcher import launch
from omnikeras.parameter_server import (
    Hyperparameters,
    ParameterServer,
    ParameterServerClient,
    PullResult,
    PushResult,
    Registration,
)

__version__ = "0.1.0"

_NEEDS_TENSORFLOW = {"GroupedAsyncStrategy": "omnikeras.strategy", "OmnivoreCallback": "omnikeras.tuner"}


def __getattr__(name: str) -> Any:
    if name in _NEEDS_TENSORFLOW:
        return getattr(importlib.import_module(_NEEDS_TENSORFLOW[name]), name)
    if name == "datasets":
        return importlib.import_module("omnikeras.datasets")
    raise AttributeError(f"module 'omnikeras' has no attribute {name!r}")


__all__ = [
    "GroupedAsyncStrategy",
    "Hyperparameters",
    "OmnivoreCallback",
    "ParameterServer",
    "ParameterServerClient",
    "PullResult",
    "PushResult",
    "Registration",
    "WorkerConfig",
    "datasets",
    "launch",
]
