#!/usr/bin/env bash
# The end-to-end recipe for a machine with Docker and kind. Our CI builds the images with
# Docker (tests/integration/test_images_docker.py) but has no kind cluster yet (tests/e2e/README.md).
#
#   tests/e2e/kind.sh            create a kind cluster, build and load both images, install
#                                the chart, run the CPU example through the in-cluster
#                                operator, then run the integration suite against the cluster
#   KEEP=1 tests/e2e/kind.sh     leave the cluster up afterwards
#
# Needs: docker, kind, kubectl, helm, python3 with the test requirements (hack/venv.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${CLUSTER:-torchrun-e2e}
REGISTRY=${REGISTRY:-ghcr.io/torchrun-dev}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
TORCH=$(sed -n 's/^torch==//p' requirements-test.txt)
OPERATOR_IMAGE=$REGISTRY/torchrun-operator:$VERSION
RUNTIME_IMAGE=$REGISTRY/torchrun-runtime:$TORCH
# The examples name the official pytorch image; the runtime image is loaded under that name
# too, so kind's nodes find it without pulling several GB.
EXAMPLE_IMAGE=$(sed -n 's/^ *image: *\(pytorch\/pytorch:[^ ]*\).*/\1/p' examples/cpu-ddp.yaml | head -1)

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done

make images REGISTRY="$REGISTRY"
docker tag "$RUNTIME_IMAGE" "$EXAMPLE_IMAGE"

if ! kind get clusters | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --config - <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
- role: worker
- role: worker
KIND
fi
cleanup() { [ "${KEEP:-0}" = 1 ] || kind delete cluster --name "$CLUSTER"; }
trap cleanup EXIT
export KUBECONFIG
KUBECONFIG=$(mktemp)
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"
for image in "$OPERATOR_IMAGE" "$RUNTIME_IMAGE" "$EXAMPLE_IMAGE"; do
  kind load docker-image --name "$CLUSTER" "$image"
done

# 1. The operator as users install it: the chart, the real image, in-cluster credentials.
helm upgrade --install torchrun-operator charts/torchrun-operator \
  -n torchrun-system --create-namespace \
  --set image.repository="$REGISTRY/torchrun-operator" --set image.tag="$VERSION" \
  --set image.pullPolicy=IfNotPresent --wait --timeout 5m
kubectl apply -f examples/cpu-ddp.yaml
kubectl wait dtj/cpu-ddp --for=jsonpath='{.status.phase}'=Succeeded --timeout=10m
PYTHONPATH=operator python3 -m torchrun_operator.cli.main status cpu-ddp
kubectl delete -f examples/cpu-ddp.yaml
helm uninstall torchrun-operator -n torchrun-system --wait

# 2. The integration suite, unchanged, against this cluster. Tests that need localkube's
# insides (the process node, its log files) are skipped with that reason.
PY=$(hack/venv.sh)
LOCALKUBE_USE_KUBECONFIG=1 "$PY" -m pytest -ra tests/integration
