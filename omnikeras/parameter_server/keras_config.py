"""A Keras object's configuration (its `get_config()`) on the wire, as a JSON object: how
the built-in schedules and constraints the server applies travel.

    >>> config_from_json(config_json({"axis": 0, "max_value": 2.0}), "constraint")
    {'axis': 0, 'max_value': 2.0}
"""

import json
from collections.abc import Mapping
from typing import Any

from omnikeras.parameter_server.errors import InvalidArgument


def config_json(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True)


def config_from_json(text: str, what: str) -> dict[str, Any]:
    """The configuration in `text`; raises `InvalidArgument`, naming `what` it configures,
    where it is not a JSON object."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidArgument(f"{what} configuration is not JSON: {error}") from None
    if not isinstance(config, dict):
        raise InvalidArgument(f"{what} configuration must be a JSON object")
    return config
