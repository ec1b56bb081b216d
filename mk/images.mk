# Container images, built with no image registry: the base image comes from Debian packages
# (images/base/build.sh, mmdebstrap), pip reaches PyPI from inside the build. Included from the
# top-level Makefile.
#   make images                          the base (when missing), operator and runtime images
#   make image-operator                  the operator image alone (about 25 s cold)
#   make images REGISTRY=my.reg/x        other tags
#   make images PYTHON_IMAGE=python:3.11-slim   start from a pulled image instead of the base
# A Docker engine is installed (apt) and started when none answers: hack/docker.sh
# (DOCKER_ENGINE= skips that). See docs/install.md, "Images".
REGISTRY ?= ghcr.io/torchrun-dev
DOCKER ?= docker
OPERATOR_VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
TORCH_VERSION ?= $(shell sed -n 's/^torch==//p' requirements-test.txt)
OPERATOR_IMAGE ?= $(REGISTRY)/torchrun-operator:$(OPERATOR_VERSION)
RUNTIME_IMAGE ?= $(REGISTRY)/torchrun-runtime:$(TORCH_VERSION)
# What image-base makes (FORCE=1 rebuilds it), and what the Dockerfiles start FROM here (their
# own default, python:3.11-slim, needs a registry).
BASE_IMAGE ?= local/python:3.11-bookworm
PYTHON_IMAGE ?= $(BASE_IMAGE)
# Empty: torch from PyPI (CUDA-enabled). e.g. https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?=
# pip inside the build uses the host's network: no dependency on Docker's NAT and forwarding.
DOCKER_BUILD_FLAGS ?= --network host
DOCKER_ENGINE ?= hack/docker.sh
# What pip trusts in the build stages (behind a TLS-inspecting proxy); empty: Debian's CAs.
BUILD_CA ?= /etc/ssl/certs/ca-certificates.crt

.PHONY: images image-base image-operator image-runtime docker-engine
images: image-operator image-runtime ## build the container images (no registry needed)

docker-engine:
	$(if $(DOCKER_ENGINE),$(DOCKER_ENGINE))

image-base: docker-engine ## the base image from Debian packages, when missing (FORCE=1 rebuilds)
	DOCKER=$(DOCKER) images/base/build.sh $(BASE_IMAGE)

# The base is built only when the Dockerfiles start from it.
image-operator: docker-engine $(if $(filter $(BASE_IMAGE),$(PYTHON_IMAGE)),image-base) ## the operator image
	DOCKER=$(DOCKER) BUILD_CA=$(BUILD_CA) images/build.sh images/operator/Dockerfile \
	  $(OPERATOR_IMAGE) \
	  $(DOCKER_BUILD_FLAGS) --build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)

image-runtime: docker-engine $(if $(filter $(BASE_IMAGE),$(PYTHON_IMAGE)),image-base) ## the training image (torch from PyPI, about 6 GB)
	DOCKER=$(DOCKER) BUILD_CA=$(BUILD_CA) images/build.sh images/runtime/Dockerfile \
	  $(RUNTIME_IMAGE) \
	  $(DOCKER_BUILD_FLAGS) --build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) \
	  --build-arg TORCH_VERSION=$(TORCH_VERSION) --build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL)
