"""`MODULE:FN` names of model builders, as `omnikeras profile --model` takes them."""

import importlib
import importlib.util
import pathlib
from collections.abc import Callable
from typing import Any

REFERENCE = "omnikeras.profiles.reference_cnn:reference_cnn"


def load_builder(spec: str) -> Callable[[], Any]:
    """The function named by `spec`: `package.module:function`, or `path/to/file.py:function`.

    A file is loaded under a private module name, so a script's `if __name__ == "__main__"`
    block does not run.

    >>> load_builder("omnikeras.profiles.reference_cnn:reference_cnn").__name__
    'reference_cnn'

    Raises:
        ValueError: `spec` has no `:`, or names nothing callable.
    """
    module_name, _, function_name = spec.rpartition(":")
    if not module_name or not function_name:
        raise ValueError(f"expected MODULE:FUNCTION, got {spec!r}")
    if module_name.endswith(".py") or "/" in module_name:
        path = pathlib.Path(module_name)
        if not path.is_file():
            raise ValueError(f"no Python file at {path}")
        loader_spec = importlib.util.spec_from_file_location(f"_omnikeras_model_{path.stem}", path)
        assert loader_spec is not None and loader_spec.loader is not None
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    builder = getattr(module, function_name, None)
    if not callable(builder):
        raise ValueError(f"{module_name} has no function {function_name!r}")
    return builder
