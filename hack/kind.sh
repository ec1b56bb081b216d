#!/usr/bin/env bash
# kind on this machine, with no image registry: the kind CLI built from its Go module
# (cluster/build.sh kind) and a node image built here (hack/kind-node-image.sh).
#
#   hack/kind.sh create [NAME [WORKERS]]   a cluster (default torchrun-kind, 0 workers: one node
#                                          that is control plane and worker), waiting until its
#                                          nodes are Ready; nothing to do if it exists. Its
#                                          kubeconfig: ~/.cache/torchrun-operator/kind/NAME.kubeconfig
#                                          (not ~/.kube/config)
#                                          Every worker mounts ~/.cache/torchrun-operator/kind/NAME-shared
#                                          at /shared: a directory the nodes' pods share
#   hack/kind.sh delete [NAME]
#   hack/kind.sh kind ARGS...              the kind CLI (e.g. get clusters, load docker-image)
#   hack/kind.sh path                      print the kind CLI's path
#
# The cluster's config adds, on cgroup v1 hosts like ours, `failCgroupV1: false` to the
# kubelet's configuration (Kubernetes v1.37 refuses cgroup v1 by default); the node image sets
# containerd's restrict_oom_score_adj. With a config of your own (`hack/kind.sh kind create
# cluster --config ...`), add the same kubeadmConfigPatches. Where dockerd cannot grant every
# capability (ours: no CAP_SYS_RESOURCE), kind's privileged node containers run with the Docker
# runtime runc-bounded (hack/runc-bounded; see bounded_runtime below).
#   K8S_VERSION KIND_VERSION   as for hack/kind-node-image.sh
#   KIND_NODE_IMAGE            a node image to use as it is (default: build local/kind-node:$K8S_VERSION)
#   KIND_WAIT                  how long `kind create cluster` waits for Ready nodes (default 5m)
#   KIND_POD_SUBNET            the pods' addresses (default 10.144.0.0/16)
#   KIND_HOST_ROUTES           1 (default): routes from the host to the pods (host_routes below)
set -euo pipefail
cd "$(dirname "$0")/.."
export K8S_VERSION=${K8S_VERSION:-v1.37.2}
export KIND_VERSION=${KIND_VERSION:-v0.33.0}

log() { echo "[kind] $*" >&2; }
die() { echo "hack/kind.sh: $*" >&2; exit 1; }

kind_cli() {
  local bin
  bin=$(cluster/build.sh kind) || die "cluster/build.sh kind failed (output above)"
  echo "$bin/kind-$KIND_VERSION"
}

# Docker 20.10 gives a privileged container every capability the kernel knows
# (moby/moby#42906); where dockerd's bounding set lacks some (ours lacks CAP_SYS_RESOURCE) runc
# then fails: "unable to apply caps: operation not permitted". kind's nodes are privileged. So
# on such hosts hack/runc-bounded (runc without the capabilities the host cannot grant) becomes
# the Docker runtime `runc-bounded` (/etc/docker/daemon.json, reloaded with SIGHUP: running
# containers and the default runtime are untouched), and kind runs with a docker CLI shim that
# adds --runtime=runc-bounded to its privileged `docker run`.
RUNTIME=runc-bounded
RUNTIME_PATH=/usr/local/libexec/torchrun-operator/runc-bounded
CACHE=${LOCALKUBE_CACHE:-$HOME/.cache/torchrun-operator}
SHIM_DIR=$CACHE/kind-docker-shim

capabilities_missing() {
  local pid bounding last
  pid=$(pgrep -xo dockerd) || pid=self
  bounding=$((16#$(awk '/^CapBnd:/ {print $2}' "/proc/$pid/status")))
  last=$(cat /proc/sys/kernel/cap_last_cap)
  [ "$bounding" -ne $(((1 << (last + 1)) - 1)) ]
}

bounded_runtime() {
  if ! cmp -s hack/runc-bounded "$RUNTIME_PATH"; then
    install -D -m 0755 hack/runc-bounded "$RUNTIME_PATH"
  fi
  if ! docker info -f '{{json .Runtimes}}' | grep -q "\"$RUNTIME\""; then
    log "registering the Docker runtime $RUNTIME ($RUNTIME_PATH) in /etc/docker/daemon.json"
    python3 - "$RUNTIME" "$RUNTIME_PATH" <<'PY'
import json, os, sys
path = "/etc/docker/daemon.json"
conf = json.load(open(path)) if os.path.exists(path) else {}
conf.setdefault("runtimes", {})[sys.argv[1]] = {"path": sys.argv[2]}
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path + ".tmp", "w") as f:
    json.dump(conf, f, indent=2)
os.replace(path + ".tmp", path)
PY
    kill -HUP "$(pgrep -xo dockerd)"
    for _ in $(seq 40); do
      docker info -f '{{json .Runtimes}}' | grep -q "\"$RUNTIME\"" && break
      sleep 0.25
    done
    docker info -f '{{json .Runtimes}}' | grep -q "\"$RUNTIME\"" ||
      die "dockerd did not load the runtime $RUNTIME from /etc/docker/daemon.json (see its log)"
  fi
  local docker
  docker=$(PATH=${PATH#"$SHIM_DIR:"} command -v docker)
  mkdir -p "$SHIM_DIR"
  cat >"$SHIM_DIR/docker.tmp" <<EOF
#!/bin/sh
# docker for kind (hack/kind.sh): privileged containers get the runtime $RUNTIME.
if [ "\$1" = run ]; then
  for a in "\$@"; do
    if [ "\$a" = --privileged ]; then shift; exec $docker run --runtime=$RUNTIME "\$@"; fi
  done
fi
exec $docker "\$@"
EOF
  chmod 0755 "$SHIM_DIR/docker.tmp"
  mv "$SHIM_DIR/docker.tmp" "$SHIM_DIR/docker"
  export PATH="$SHIM_DIR:$PATH"
}

# Host routes to each node's podCIDR through the node's address on Docker's kind network, as
# the CNI sets up between nodes: processes on the host (the integration tests' operator, which
# asks each pod for its rank map and progress on its pod IP) reach pods as from a node.
# KIND_HOST_ROUTES=0: none.
host_routes() {  # add|del name
  [ "${KIND_HOST_ROUTES:-1}" = 1 ] || return 0
  local node ip cidr
  for node in $(kind_run get nodes --name "$2" 2>/dev/null); do
    ip=$(docker inspect -f '{{with index .NetworkSettings.Networks "kind"}}{{.IPAddress}}{{end}}' "$node") || continue
    if [ "$1" = add ]; then
      cidr=$("$(cluster/build.sh kind)/kubectl" --kubeconfig "$CACHE/kind/$2.kubeconfig" \
        get node "$node" -o jsonpath='{.spec.podCIDR}')
      [ -n "$cidr" ] && ip route replace "$cidr" via "$ip"
    else
      ip -4 route show via "$ip" | awk '{print $1}' | while read -r cidr; do
        ip route del "$cidr" via "$ip"
      done
    fi
  done
}

# The kind CLI, with the runtime above where the host needs it.
kind_run() {
  local kind
  kind=$(kind_cli)
  if capabilities_missing; then
    bounded_runtime
  fi
  "$kind" "$@"
}

# Pod addresses: outside the 10.200-254.0.0/16 networks local clusters take (localkube), since
# the host routes to them (below).
POD_SUBNET=${KIND_POD_SUBNET:-10.144.0.0/16}

# One directory of this host mounted into every worker at /shared: a hostPath under it is the
# same directory on every node, which a job's pods spread over nodes share (the tests keep
# checkpoints there: tests/integration/shared_dir.py finds it through `docker inspect`).
SHARED_MOUNT=/shared
shared_dir() { echo "$CACHE/kind/$1-shared"; }

config() {  # workers, shared directory
  echo "kind: Cluster"
  echo "apiVersion: kind.x-k8s.io/v1alpha4"
  echo "networking:"
  echo "  podSubnet: $POD_SUBNET"
  echo "nodes:"
  echo "- role: control-plane"
  for _ in $(seq "$1"); do
    echo "- role: worker"
    echo "  extraMounts:"
    echo "  - hostPath: $2"
    echo "    containerPath: $SHARED_MOUNT"
  done
  # Kubernetes' own gang scheduling (the Workload API, beta and off by default in 1.37), on
  # as the local cluster has it (cluster/localkube/components.py: WORKLOAD_GATES).
  echo "featureGates:"
  echo "  GenericWorkload: true"
  echo "runtimeConfig:"
  echo '  "scheduling.k8s.io/v1beta1": "true"'
  if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
    cat <<'EOF'
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  failCgroupV1: false
EOF
  fi
}

cmd=${1:-}
shift || true
case $cmd in
  create)
    name=${1:-torchrun-kind} workers=${2:-0}
    hack/docker.sh || die "no Docker engine (hack/docker.sh failed)"
    if kind_run get clusters 2>/dev/null | grep -qx "$name"; then
      log "cluster $name exists"
      host_routes add "$name"
      exit 0
    fi
    image=${KIND_NODE_IMAGE:-$(hack/kind-node-image.sh)} || die "no node image (hack/kind-node-image.sh failed)"
    start=$(date +%s)
    mkdir -p "$CACHE/kind" "$(shared_dir "$name")"
    config "$workers" "$(shared_dir "$name")" | kind_run create cluster --name "$name" --image "$image" \
      --kubeconfig "$CACHE/kind/$name.kubeconfig" --wait "${KIND_WAIT:-5m}" --config - ||
      die "kind create cluster failed; \`hack/kind.sh kind export logs --name $name DIR\` collects the nodes' logs"
    # kind waits for the control plane only; workers become Ready once the CNI runs on them.
    "$(cluster/build.sh kind)/kubectl" --kubeconfig "$CACHE/kind/$name.kubeconfig" \
      wait --for=condition=Ready nodes --all --timeout="${KIND_WAIT:-5m}" >/dev/null ||
      die "not every node of $name became Ready"
    host_routes add "$name"
    log "cluster $name ($((workers + 1)) nodes) up in $(($(date +%s) - start))s; KUBECONFIG=$CACHE/kind/$name.kubeconfig"
    ;;
  delete)
    name=${1:-torchrun-kind}
    host_routes del "$name"
    kind_run delete cluster --name "$name" --kubeconfig "$CACHE/kind/$name.kubeconfig"
    rm -rf "$CACHE/kind/$name.kubeconfig" "$(shared_dir "$name")"
    ;;
  kind)
    kind_run "$@"
    ;;
  path)
    kind_cli
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
