# kind with no image registry: the kind CLI and a node image built here (hack/kind.sh,
# hack/kind-node-image.sh; docs/install.md, "kind, built here"). Not part of `make test`.
#   make kind          the cluster torchrun-kind (one node); KUBECONFIG:
#                      ~/.cache/torchrun-operator/kind/torchrun-kind.kubeconfig
#   make kind-delete   delete it
#   make kind-image    the node image alone (local/kind-node:v1.37.2)
#   make kind-e2e      tests/e2e/kind.sh: images, a cluster, the chart, the CPU example, the
#                      integration suite against it
.PHONY: kind kind-delete kind-image kind-e2e

kind-image: ## build the kind node image here (Debian packages, Go modules; no registry)
	nice -n 10 hack/kind-node-image.sh

kind: ## a kind cluster from the node image built here (hack/kind.sh create)
	nice -n 10 hack/kind.sh create

kind-delete: ## delete the kind cluster of `make kind`
	hack/kind.sh delete

kind-e2e: venv ## tests/e2e/kind.sh: the chart, the CPU example and the integration suite on kind
	tests/e2e/kind.sh
