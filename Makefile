# The two commands of the README: `make run` (the main job) and `make test` (the tests).
# Both create or reuse the virtual environment in $(VENV) and install what they need.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

# Debian's packages need root: sudo where we are not.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup data run lint test test-fast test-benchmarks protos

setup: $(INSTALLED) data

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

# Fashion-MNIST from Debian's package where apt is available; elsewhere Keras downloads it.
data:
	@if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null; then \
		$(SUDO) apt-get install -y -q dataset-fashion-mnist \
		|| ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q dataset-fashion-mnist) \
		|| echo "dataset-fashion-mnist could not be installed: Keras will download Fashion-MNIST"; \
	fi

run: setup
	$(PY) -m omnikeras launch --workers 1 examples/fashion_mnist.py --epochs 5

lint: setup
	$(VENV)/bin/ruff check omnikeras tests benchmarks tools examples
	$(VENV)/bin/mypy

# The quick runs of the longest benchmark scripts are left to `make test-benchmarks`, so
# that CI (which runs `make test`) stays within 30 minutes.
test: lint
	$(PY) -m pytest -m "not benchmark_run"

test-fast: setup
	$(PY) -m pytest -m "not slow and not benchmark_run"

test-benchmarks: setup
	$(PY) -m pytest -m benchmark_run

# The generated stubs under omnikeras/v1/ come from here only.
protos: setup
	$(PY) tools/generate_protos.py
