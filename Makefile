# NodeWright developer entry points. `make sandbox` and `make test` are the two commands the
# README promises; both set everything up themselves.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup rig sandbox test lint typecheck unit clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP) rig

# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok from the Go
# module proxy into ~/.cache/nodewright-rig (once; later runs return at once).
rig:
	scripts/build-rig.sh

sandbox: setup
	$(BIN)/nodewright sandbox

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

test: setup lint typecheck
	$(BIN)/pytest -p no:cacheprovider

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
