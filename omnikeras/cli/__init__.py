"""The `omnikeras` command line."""
