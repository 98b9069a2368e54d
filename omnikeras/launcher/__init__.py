"""Starts a whole cluster on this machine: parameter-server shards and worker processes."""

from omnikeras.launcher.launcher import launch

__all__ = ["launch"]
