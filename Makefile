# One command brings up the local cluster and runs the example (make demo); one runs every test
# (make test). Both build what they need first.
SHELL := /bin/bash
export PYTHONPATH := $(CURDIR)/operator:$(CURDIR)/cluster
BIN = $(shell cluster/build.sh)
# The tests need more than the cluster: the scale benchmark's smoke test runs KWOK, Kubeflow's
# training-operator and Trainer v2 + JobSet, so `make test` builds everything
# (`cluster/build.sh all`).
TEST_BIN = $(shell cluster/build.sh all)

.PHONY: help test unit e2e lint fmt demo up down crds build build-all venv torch-root sysdeps

sysdeps: ## install the Debian packages the tests use (hack/sysdeps/packages.tsv), where missing
	hack/sysdeps/install.sh --group build test

build: ## build the local cluster's binaries (cluster/build.sh)
	cluster/build.sh

build-all: ## the same, plus the kubelet and pause (real nodes), KWOK, training-operator, Trainer v2 + JobSet and Kueue
	cluster/build.sh all

venv: ## make or reuse the pinned test environment, linked as .venv
	hack/venv.sh

torch-root: ## the Debian root with Debian's torch 2.6 the launcher's tests also run in
	hack/torch-root.sh >/dev/null

# The suite mostly waits on clusters, so it runs in TEST_WORKERS pytest-xdist workers, each
# with a cluster of its own, a module's tests on one worker (--dist loadscope: its module
# fixtures start once), handed out in the order tests/conftest.py sorts them
# (longest first; xdist's own reorder puts modules with many tests first). The Docker tests
# then run alone: with a Docker engine running, process-node pods beside it have been seen
# to fail (tests/conftest.py).
TEST_WORKERS ?= 3
PYTEST = LOCALKUBE_BIN=$(TEST_BIN) .venv/bin/python -m pytest -ra
XDIST = -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
test: sysdeps build-all venv torch-root lint ## everything CI runs: build, lint, every test
	rc=0; \
	$(PYTEST) --durations=30 $(XDIST) -m "not docker" || rc=$$?; \
	$(PYTEST) --durations=10 -m docker || rc=$$((rc ? rc : $$?)); \
	exit $$rc

e2e: sysdeps build-all venv ## real containers only: images on Docker, pods on a real kubelet (docs/install.md)
	LOCALKUBE_BIN=$(TEST_BIN) .venv/bin/python -m pytest -ra tests/integration/test_images_docker.py \
	  tests/localkube/test_real_node.py tests/localkube/test_docker_bridge.py

unit: venv ## the unit tests only
	.venv/bin/python -m pytest -ra tests/unit

lint: venv ## ruff, ruff format --check, mypy, import-linter contracts, shellcheck
	.venv/bin/python -m ruff check .
	.venv/bin/python -m ruff format --check .
	hack/mypy.sh
	.venv/bin/lint-imports --no-cache --no-logo
	hack/shellcheck.sh

fmt: venv ## ruff check --fix, then ruff format
	.venv/bin/python -m ruff check --fix .
	.venv/bin/python -m ruff format .

crds: venv ## regenerate the CRDs, the chart's copy and deploy/install.yaml
	PYTHONPATH=operator .venv/bin/python -m torchrun_operator.api.crd --write crds
	hack/sync-chart-crds.sh
	hack/gen-install-manifest.sh

up: build venv ## start the local cluster
	LOCALKUBE_BIN=$(BIN) .venv/bin/python -m localkube up

down: venv ## stop the demo's operator and the local cluster
	-[ -f .cluster/operator.pid ] && kill $$(cat .cluster/operator.pid) && rm -f .cluster/operator.pid
	.venv/bin/python -m localkube down

# Not `build venv` as prerequisites: make would echo each recipe and its output; the build's
# own progress lines (cluster/build.sh, on stderr) and demo.sh's are what a newcomer reads.
demo: ## local cluster, operator and the CPU example, in one command
	@bin=$$(cluster/build.sh) && LOCALKUBE_BIN=$$bin hack/demo.sh

help: ## list the targets and what each does
	@awk -F: '/^[A-Za-z0-9_-]+:([^=]|$$)/ && !seen[$$1]++ { \
		if (match($$0, /## /)) printf "  %-14s %s\n", $$1, substr($$0, RSTART + 3); \
		else rest = rest " " $$1 } \
		END { if (rest) print "  and, without a description:" rest }' $(MAKEFILE_LIST)

-include mk/images.mk
-include mk/bench.mk
-include mk/kind.mk
