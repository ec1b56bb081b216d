# Container images. Included from the top-level Makefile.
#   make images                    build both
#   make images REGISTRY=my.reg/x  elsewhere
REGISTRY ?= ghcr.io/torchrun-dev
DOCKER ?= docker
OPERATOR_VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
TORCH_VERSION ?= $(shell sed -n 's/^torch==//p' requirements-test.txt)
OPERATOR_IMAGE ?= $(REGISTRY)/torchrun-operator:$(OPERATOR_VERSION)
RUNTIME_IMAGE ?= $(REGISTRY)/torchrun-runtime:$(TORCH_VERSION)

.PHONY: images image-operator image-runtime
images: image-operator image-runtime

image-operator:
	$(DOCKER) build -f images/operator/Dockerfile -t $(OPERATOR_IMAGE) .

image-runtime:
	$(DOCKER) build -f images/runtime/Dockerfile \
	  --build-arg TORCH_VERSION=$(TORCH_VERSION) -t $(RUNTIME_IMAGE) .
