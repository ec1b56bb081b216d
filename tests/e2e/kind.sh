#!/usr/bin/env bash
# End to end on kind, with kind and its node image built here (hack/kind.sh; no registry):
#
#   tests/e2e/kind.sh            build both images (make images), create a kind cluster, load
#                                the images, install the chart, run the CPU example through the
#                                in-cluster operator, then run the integration suite against
#                                the cluster
#   KEEP=1 tests/e2e/kind.sh     leave the cluster up afterwards (a second run reuses it)
#
#   CLUSTER   the cluster's name (default torchrun-e2e)
#   WORKERS   worker nodes (default 2: pods on different nodes, a node lost). The images are
#             loaded onto the workers only (the control plane is tainted): the runtime image
#             takes ~12 GB of disk per node.
#   TESTS     what pytest runs in step 2 (default tests/integration)
#   MIN_FREE_GB   what must stay free on Docker's disk after loading the images (default 2):
#             `kind load docker-image` takes about twice an image's size per node (its content
#             and its unpacked layers, ~12 GB for the runtime image) plus once more for its
#             temporary archive when TMPDIR is on that disk (TMPDIR=/dev/shm spares that); the
#             load is refused with the figures rather than fill the disk
#
# Needs: root, Docker (hack/docker.sh starts one), Go, python3 with the test requirements
# (hack/venv.sh). kind, kubectl and helm are the ones cluster/build.sh builds.
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${CLUSTER:-torchrun-e2e}
WORKERS=${WORKERS:-2}
REGISTRY=${REGISTRY:-ghcr.io/torchrun-dev}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
TORCH=$(sed -n 's/^torch==//p' requirements-test.txt)
OPERATOR_IMAGE=$REGISTRY/torchrun-operator:$VERSION
RUNTIME_IMAGE=$REGISTRY/torchrun-runtime:$TORCH
# The examples name the official pytorch image; the runtime image is loaded under that name
# too, so kind's nodes find it without pulling several GB.
EXAMPLE_IMAGE=$(sed -n 's/^ *image: *\(pytorch\/pytorch:[^ ]*\).*/\1/p' examples/cpu-ddp.yaml | head -1)

t0=$(date +%s)
step() { echo "=== [$(($(date +%s) - t0))s] $*" >&2; }

step "images"
make images REGISTRY="$REGISTRY"
docker tag "$RUNTIME_IMAGE" "$EXAMPLE_IMAGE"

step "cluster $CLUSTER"
BIN=$(cluster/build.sh kind)
kind() { hack/kind.sh kind "$@"; }
KUBECTL=$BIN/kubectl
HELM=$(hack/find-helm.sh)
PY=$(hack/venv.sh)
hack/kind.sh create "$CLUSTER" "$WORKERS"
cleanup() {
  if [ "${KEEP:-0}" != 1 ]; then
    hack/kind.sh delete "$CLUSTER"
  fi
}
trap cleanup EXIT
export KUBECONFIG
KUBECONFIG=$(mktemp)
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"

step "load images"
nodes=$(kind get nodes --name "$CLUSTER" | grep -- '-worker' | sort | paste -sd, -) ||
  nodes=$CLUSTER-control-plane
images=("$OPERATOR_IMAGE" "$RUNTIME_IMAGE" "$EXAMPLE_IMAGE")
root=$(docker info -f '{{.DockerRootDir}}')
need=0
for image in "$OPERATOR_IMAGE" "$RUNTIME_IMAGE"; do
  size=$(docker image inspect -f '{{.Size}}' "$image") missing=0
  for node in ${nodes//,/ }; do
    docker exec "$node" crictl inspecti -q "$image" >/dev/null 2>&1 || missing=$((missing + 1))
  done
  need=$((need + 2 * size * missing))
  if ((missing)) && [ "$(stat -c %d "${TMPDIR:-/tmp}")" = "$(stat -c %d "$root")" ]; then
    need=$((need + size))
  fi
done
need=$((need + ${MIN_FREE_GB:-2} * 1024 * 1024 * 1024))
free=$(df --output=avail -B1 "$root" | tail -1)
if [ "$free" -lt "$need" ]; then
  echo "not loading: the images need about $((need >> 30)) GB free on $root's disk (with" \
    "MIN_FREE_GB=${MIN_FREE_GB:-2} left over), it has $((free >> 30)) GB" >&2
  exit 1
fi
kind load docker-image --name "$CLUSTER" --nodes "$nodes" "${images[@]}"
# Some tests name python:3.11 for plain Python pods (the local cluster ignores images): the
# runtime image answers to that name too, tagged in the nodes' containerd only.
for node in ${nodes//,/ }; do
  docker exec "$node" ctr --namespace=k8s.io images tag --force "$RUNTIME_IMAGE" \
    docker.io/library/python:3.11 >/dev/null
done

# 1. The operator as users install it: the chart, the real image, in-cluster credentials.
step "chart and the CPU example"
"$HELM" upgrade --install torchrun-operator charts/torchrun-operator \
  -n torchrun-system --create-namespace \
  --set image.repository="$REGISTRY/torchrun-operator" --set image.tag="$VERSION" \
  --set image.pullPolicy=IfNotPresent --wait --timeout 5m
"$KUBECTL" apply -f examples/cpu-ddp.yaml
if ! "$KUBECTL" wait dtj/cpu-ddp --for=jsonpath='{.status.phase}'=Succeeded --timeout=10m; then
  "$KUBECTL" get dtj,pods -o wide >&2 || true
  "$KUBECTL" -n torchrun-system logs deploy/torchrun-operator --tail=50 >&2 || true
  exit 1
fi
PYTHONPATH=operator "$PY" -m torchrun_operator.cli.main status cpu-ddp
"$KUBECTL" delete -f examples/cpu-ddp.yaml
"$HELM" uninstall torchrun-operator -n torchrun-system --wait

# 2. The integration suite, unchanged, against this cluster. Tests that need localkube's
# insides are skipped with that reason; the Helm install tests run the operator image loaded
# above (TORCHRUN_OPERATOR_IMAGE).
step "integration tests: ${TESTS:-tests/integration}"
# shellcheck disable=SC2086  # TESTS is a list of pytest arguments
LOCALKUBE_USE_KUBECONFIG=1 TORCHRUN_OPERATOR_IMAGE=$OPERATOR_IMAGE "$PY" -m pytest -ra ${TESTS:-tests/integration}
step "done"
