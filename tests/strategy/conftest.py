"""Fixtures shared by the strategy's tests."""

from collections.abc import Iterator

import pytest

from omnikeras import ParameterServer


@pytest.fixture
def server() -> Iterator[ParameterServer]:
    """A parameter server in this process, on a free port, stopped after the test."""
    server = ParameterServer()
    server.start()
    yield server
    server.stop()
