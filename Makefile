# One command brings up the local cluster and runs the example (make demo); one runs every test
# (make test). Both build what they need first.
SHELL := /bin/bash
export PYTHONPATH := $(CURDIR)/operator:$(CURDIR)/cluster
BIN = $(shell cluster/build.sh)
# The tests need more than the cluster: the scale benchmark's smoke test runs KWOK and
# Kubeflow's training-operator, so `make test` builds everything (`cluster/build.sh all`).
TEST_BIN = $(shell cluster/build.sh all)

.PHONY: test unit lint demo up down crds build build-all venv

build:
	cluster/build.sh

build-all:
	cluster/build.sh all

venv:
	hack/venv.sh

test: build-all venv lint
	LOCALKUBE_BIN=$(TEST_BIN) .venv/bin/python -m pytest -ra

unit: venv
	.venv/bin/python -m pytest -ra tests/unit

lint: venv
	.venv/bin/python -m ruff check .
	.venv/bin/python -m ruff format --check .
	.venv/bin/python -m mypy operator/torchrun_operator cluster/localkube

crds: venv
	PYTHONPATH=operator .venv/bin/python -m torchrun_operator.api.crd > crds/torchrun.dev_distributedtrainingjobs.yaml
	hack/sync-chart-crds.sh
	hack/gen-install-manifest.sh

up: build venv
	LOCALKUBE_BIN=$(BIN) .venv/bin/python -m localkube up

down: venv
	-[ -f .cluster/operator.pid ] && kill $$(cat .cluster/operator.pid) && rm -f .cluster/operator.pid
	.venv/bin/python -m localkube down

demo: build venv
	LOCALKUBE_BIN=$(BIN) hack/demo.sh

-include mk/images.mk
-include mk/bench.mk
