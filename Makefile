# NodeWright developer entry points. `make sandbox` and `make test` are the two commands the
# README promises; both set everything up themselves.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup host-deps rig images sandbox sandbox-real sandbox-helm test lint typecheck unit clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP) host-deps rig images

# Debian packages the real nodes, the image build and the tests use that neither PyPI nor the
# Go module proxy provides (skipped when installed).
host-deps:
	scripts/install-host-deps.sh

# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy,
# kubectl, kwok, helm, containerd, CoreDNS, crane, the pause program and the tools the tests
# use (the nats CLI, krew, toxiproxy) from the Go module proxy into ~/.cache/nodewright-rig, with
# promtool from Debian's prometheus package and the Prometheus Operator's ServiceMonitor/PodMonitor CRDs from its module (once; later
# runs return at once).
rig:
	scripts/build-rig.sh

# Builds the services, agent, example package and pause images with buildah (no daemon)
# into ~/.cache/nodewright-images as OCI archives (once per change of their inputs).
images: $(STAMP) host-deps
	PYTHON=$(PY) scripts/build-images.sh

sandbox: setup
	$(BIN)/nodewright sandbox

# The sandbox plus one real node (containerd + kubelet) on which the example package runs.
sandbox-real: setup
	$(BIN)/nodewright sandbox --real-node

# NodeWright installed as a user installs it: the official NATS chart (three JetStream
# servers) and deploy/chart/nodewright with Helm, as pods on two real nodes. The NATS chart
# comes from NATS_CHART (default: ../shared/vendor/charts/nats-2.14.2.tgz).
sandbox-helm: setup
	$(BIN)/nodewright sandbox --helm $(if $(NATS_CHART),--nats-chart $(NATS_CHART))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

test: setup lint typecheck
	$(BIN)/pytest -p no:cacheprovider

# The tests that need no rig (pure cores, the kernel, shells against in-memory fakes): no
# control plane, no nats-server, no lock (COORDINATION.md); about a minute and a half.
unit: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider -m "not rig"

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
