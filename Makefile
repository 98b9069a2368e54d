# The two commands of the README: `make run` (the main job) and `make test` (the tests).
# Both create or reuse the virtual environment in $(VENV) and install what they need.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: setup run test test-fast protos

setup: $(INSTALLED)

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

run: setup
	$(PY) benchmarks/ps_roundtrip.py

test: setup
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow"

# The generated stubs under omnikeras/v1/ come from here only.
protos: setup
	$(PY) tools/generate_protos.py
