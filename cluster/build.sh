#!/usr/bin/env bash
# Builds the local cluster's binaries from the Go module proxy into a cache folder keyed by
# version, and prints that folder. A warm cache returns at once; a warm Go build cache makes a
# rebuild take a minute or two instead of a cold build's half hour.
#
# Kubernetes: k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces every staging
# module with ./staging/...), so a wrapper module requires it and replaces each staging module
# with its published v0.Y.Z, derived from the release's own go.mod.
set -euo pipefail
BUILD_SCRIPT=$(realpath "$0")

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
COREDNS_VERSION=${COREDNS_VERSION:-v1.12.4}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
KWOK_VERSION=${KWOK_VERSION:-v0.7.0}
TRAINING_OPERATOR_VERSION=${TRAINING_OPERATOR_VERSION:-v1.9.3}
KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
TRAINER_VERSION=${TRAINER_VERSION:-v2.3.0}
JOBSET_VERSION=${JOBSET_VERSION:-v0.12.0}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
KUBE_NETWORK_POLICIES_VERSION=${KUBE_NETWORK_POLICIES_VERSION:-v0.8.0}
# kind's storage default; v0.0.30 is the newest version the module proxy serves (kind v0.33.0
# builds v0.0.34 from GitHub).
LOCAL_PATH_PROVISIONER_VERSION=${LOCAL_PATH_PROVISIONER_VERSION:-v0.0.30}
CACHE=${LOCALKUBE_CACHE:-$HOME/.cache/torchrun-operator}
# core: control plane + coredns + helm; kubelet: core + the real node's kubelet and pause;
# kueue: core + kueue; trainer: core + Kubeflow Trainer v2 and JobSet; netpol: core +
# kube-network-policies (the process node's NetworkPolicy enforcer); all: all of those, kwok
# and training-operator; kind: core + kubelet, pause and what a kind node image needs besides
# (hack/kind-node-image.sh): kubeadm, kube-proxy, kubectl, crictl, local-path-provisioner,
# kube-network-policies, and kind itself.
WHAT=${*:-core}

key="k8s-$K8S_VERSION.etcd-$ETCD_VERSION.coredns-$COREDNS_VERSION.helm-$HELM_VERSION"
BIN="$CACHE/bin/$key"
mkdir -p "$BIN" "$CACHE/src"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

have() { for b in "$@"; do [ -x "$BIN/$b" ] || return 1; done; }

# Quiet by default: Go's own output (hundreds of `go: downloading` lines on a cold build) goes
# to BUILD_LOG, and the terminal gets one line as each component starts and one as it ends,
# with the time taken and the binaries still to build; on a failure, the log's tail.
# BUILD_VERBOSE=1 prints everything as it comes.
BUILD_LOG=${BUILD_LOG:-$CACHE/build.log}
exec 3>&2
[ "${BUILD_VERBOSE:-0}" = 1 ] || exec 2>>"$BUILD_LOG"
# The binaries each target ends with, in build order: what "left" counts down.
expected() {
  local core="kube-apiserver kube-controller-manager kube-scheduler etcd coredns helm"
  case "$WHAT" in
    core) echo "$core" ;;
    kubelet) echo "$core kubelet pause" ;;
    kueue) echo "$core kueue-$KUEUE_VERSION" ;;
    trainer) echo "$core trainer-controller-manager-$TRAINER_VERSION jobset-$JOBSET_VERSION" ;;
    netpol) echo "$core kube-network-policies-$KUBE_NETWORK_POLICIES_VERSION" ;;
    all) echo "$core kubelet pause kwok training-operator-$TRAINING_OPERATOR_VERSION" \
      "trainer-controller-manager-$TRAINER_VERSION jobset-$JOBSET_VERSION kueue-$KUEUE_VERSION" \
      "kube-network-policies-$KUBE_NETWORK_POLICIES_VERSION" ;;
    kind) echo "$core kubelet pause kubeadm kube-proxy kubectl crictl local-path-provisioner" \
      "kind-$KIND_VERSION kube-network-policies-$KUBE_NETWORK_POLICIES_VERSION" ;;
  esac
}
left() {
  local b out=()
  for b in $(expected); do [ -x "$BIN/$b" ] || out+=("$b"); done
  echo "${out[*]:-nothing}"
}
took() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
current="" current_start=0 logged=0
log() {  # a component starts (the one before it has ended)
  ended
  if ((!logged)); then
    logged=1
    : >"$BUILD_LOG"  # this run's output only (a warm run writes nothing and keeps the last)
    echo "[build] $WHAT: building $(left) (Go's output: $BUILD_LOG)" >&3
  fi
  current=$* current_start=$SECONDS
  echo "[build] $current ..." >&3
}
ended() {
  [ -n "$current" ] || return 0
  echo "[build] $current: done in $(took $((SECONDS - current_start))); left: $(left)" >&3
  current=""
}
on_exit() {
  local rc=$?
  if ((rc == 0)); then
    ended
    ((!logged)) || echo "[build] $WHAT: done in $(took "$SECONDS")" >&3
  else
    echo "[build] ${current:-build} FAILED (exit $rc); the last lines of $BUILD_LOG:" >&3
    tail -n 40 "$BUILD_LOG" >&3 2>/dev/null || true
  fi
}
trap on_exit EXIT

# -ldflags for a Kubernetes binary: stripped, and stamped with the release's version (kubeadm
# checks its own against the cluster's; unstamped it says v0.0.0).
k8s_ldflags() {
  local minor p L="-s -w"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    L="$L -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$L"
}

# Builds k8s.io/kubernetes/cmd/<cmd>... in the control plane's wrapper module (build_k8s), so
# every binary has the same k8s.io/kubernetes version and staging pins; tools.go lists them.
build_k8s_cmds() {  # cmd...
  local cmd pkgs=()
  cd "$CACHE/src/k8s-$K8S_VERSION"
  for cmd in "$@"; do
    grep -q "cmd/$cmd\"" tools.go || sed -i 's#^)$#\t_ "k8s.io/kubernetes/cmd/'"$cmd"'"\n)#' tools.go
    pkgs+=("k8s.io/kubernetes/cmd/$cmd")
  done
  go mod tidy -e >&2 || true
  go build -trimpath -ldflags "$(k8s_ldflags)" -o "$BIN/" "${pkgs[@]}" >&2
}

# A module whose go.mod cannot be `go install`ed as it is, built through a wrapper module that
# requires it and nothing else (so its own pins win, as with go install).
build_wrapped() {  # src-dir binary go-version module@version package [ldflags]
  local dir="$CACHE/src/$1" bin=$2 gover=$3 modver=$4 pkg=$5 ld=${6:-}
  mkdir -p "$dir" && cd "$dir"
  printf 'module localkube/%sbin\n\ngo %s\n' "${1%%-*}" "$gover" > go.mod
  go get "$modver" >&2
  go build -trimpath -ldflags "-s -w $ld" -o "$BIN/$bin" "$pkg" >&2
}

build_k8s() {
  have kube-apiserver kube-controller-manager kube-scheduler && return
  local dir="$CACHE/src/k8s-$K8S_VERSION"
  log "kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler)"
  mkdir -p "$dir" && cd "$dir"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module localkube/k8sbin"
    echo
    echo "go 1.24.0"
    echo
    echo "godebug default=go1.24"
    echo
    echo "replace ("
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/[a-z0-9-]*$#\t\1 => \1 v0.'"${K8S_VERSION#v1.}"'#p' "$gomod"
    echo ")"
  } > go.mod
  grep -c '=>' go.mod >&2
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  go get "k8s.io/kubernetes@$K8S_VERSION" >&2
  build_k8s_cmds kube-apiserver kube-controller-manager kube-scheduler
}

# The real node's kubelet (localkube --real-nodes): the same wrapper module as the control
# plane, so the same k8s.io/kubernetes version and staging pins. The build cache shares most of
# the packages with kube-apiserver's.
build_kubelet() {
  have kubelet && return
  build_k8s
  log "kubelet $K8S_VERSION"
  build_k8s_cmds kubelet
}

# The pod sandbox's pause process, from the same release's build/pause/linux/pause.c, static
# (no libc in its image). Its version is the release's pause tag (build/pause/Makefile).
build_pause() {
  have pause && return
  local src tag
  src=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/build/pause
  tag=$(sed -n 's/^TAG ?= //p' "$src/Makefile")
  log "pause $tag (gcc -static)"
  ${CC:-gcc} -Os -Wall -Werror -static -DVERSION="v$tag-$K8S_VERSION" -o "$BIN/pause" "$src/linux/pause.c" >&2
  echo "$tag" > "$BIN/pause.tag"
}

# kubeadm, kube-proxy and kubectl for kind's node image, like the kubelet: the same wrapper
# module, pins and version stamps as the control plane (kubeadm checks its own version against
# the cluster's; it must say v1.37.2, not v0.0.0).
build_k8s_node_tools() {
  have kubeadm kube-proxy kubectl && return
  build_k8s
  log "kubeadm kube-proxy kubectl $K8S_VERSION"
  build_k8s_cmds kubeadm kube-proxy kubectl
}

build_etcd() {  # [version [binary name]]
  local version=${1:-$ETCD_VERSION} name=${2:-etcd}
  have "$name" && return
  log "etcd $version"
  build_wrapped "etcd-$version" "$name" 1.24.0 "go.etcd.io/etcd/server/v3@$version" go.etcd.io/etcd/server/v3
}

# The etcd and CoreDNS that this kubeadm deploys (its image list, e.g. etcd:3.7.0-0 and
# coredns:v1.14.6 for v1.37.2), for the images of kind's node: etcd-vX.Y.Z and coredns-vX.Y.Z.
build_kubeadm_addons() {
  local images etcd_tag coredns_tag
  images=$("$BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION")
  etcd_tag=$(sed -n 's#.*/etcd:##p' <<<"$images")
  coredns_tag=$(sed -n 's#.*/coredns:##p' <<<"$images")
  [ -n "$etcd_tag" ] && [ -n "$coredns_tag" ] || { echo "kubeadm lists no etcd or coredns image: $images" >&2; exit 1; }
  build_etcd "v${etcd_tag%-*}" "etcd-v${etcd_tag%-*}"
  if ! have "coredns-$coredns_tag"; then  # beside the local cluster's coredns, not over it
    local tmp
    tmp=$(mktemp -d)
    log "coredns $coredns_tag"
    GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$coredns_tag" >&2
    mv "$tmp/coredns" "$BIN/coredns-$coredns_tag"
    rmdir "$tmp"
  fi
}

# JobSet: `go install sigs.k8s.io/jobset@v` asks the proxy for the module's version list (to
# warn of a deprecation), which the proxy refuses for this module; a wrapper module that
# requires it (no other requirement, so its own pins win, as with go install) builds it.
build_jobset() {
  have "jobset-$JOBSET_VERSION" && return
  log "sigs.k8s.io/jobset@$JOBSET_VERSION"
  build_wrapped "jobset-$JOBSET_VERSION" "jobset-$JOBSET_VERSION" 1.26.0 "sigs.k8s.io/jobset@$JOBSET_VERSION" \
    sigs.k8s.io/jobset "-X sigs.k8s.io/jobset/pkg/version.GitVersion=$JOBSET_VERSION"
}

# The process node's NetworkPolicy enforcer: kube-network-policies' pkg/networkpolicy with the
# command in cluster/netpol/main.go (it says why not upstream's cmd), in a wrapper module that
# requires the release and nothing else, so its own pins win.
build_netpol() {
  local bin="kube-network-policies-$KUBE_NETWORK_POLICIES_VERSION"
  have "$bin" && return
  log "sigs.k8s.io/kube-network-policies@$KUBE_NETWORK_POLICIES_VERSION"
  local dir="$CACHE/src/$bin"
  mkdir -p "$dir"
  cp "$(dirname "$BUILD_SCRIPT")/netpol/main.go" "$dir/main.go"
  cd "$dir"
  printf 'module localkube/netpolbin\n\ngo 1.24.0\n' > go.mod
  go get "sigs.k8s.io/kube-network-policies@$KUBE_NETWORK_POLICIES_VERSION" >&2
  go mod tidy >&2
  go build -trimpath -ldflags "-s -w" -o "$BIN/$bin" . >&2
}

gobin_install() {  # name pkg@version
  have "$1" && return
  log "$2"
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w ${3:-}" "$2" >&2
}

build_k8s
build_etcd
gobin_install coredns "github.com/coredns/coredns@$COREDNS_VERSION"
gobin_install helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
if [ "$WHAT" = kubelet ] || [ "$WHAT" = all ]; then
  build_kubelet
  build_pause
fi
if [ "$WHAT" = all ]; then
  gobin_install kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  # Kubeflow's training-operator (the benchmarks' comparison). Its go.mod has no replace
  # directives, so `go install` builds it in its own module with its own pins (k8s 0.31).
  # The binary's name carries the version; its CRDs stay in the module cache (bench/scale).
  if ! have "training-operator-$TRAINING_OPERATOR_VERSION"; then
    gobin_install training-operator.v1 \
      "github.com/kubeflow/training-operator/cmd/training-operator.v1@$TRAINING_OPERATOR_VERSION"
    mv "$BIN/training-operator.v1" "$BIN/training-operator-$TRAINING_OPERATOR_VERSION"
  fi
fi
if [ "$WHAT" = all ] || [ "$WHAT" = trainer ]; then
  # Kubeflow Trainer v2's controller manager and the JobSet controller it drives (a
  # comparison in the benchmarks, bench/scale). JobSet's version is the one Trainer's go.mod requires and
  # its manifests install (manifests/third-party/jobset). Neither go.mod has replace
  # directives: each builds with its own pins (JobSet through build_jobset). CRDs, webhooks
  # and the torch ClusterTrainingRuntime stay in the module cache (bench/scale/trainer.py).
  if ! have "trainer-controller-manager-$TRAINER_VERSION"; then
    gobin_install trainer-controller-manager \
      "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager@$TRAINER_VERSION"
    mv "$BIN/trainer-controller-manager" "$BIN/trainer-controller-manager-$TRAINER_VERSION"
  fi
  build_jobset
fi
if [ "$WHAT" = kind ]; then
  build_kubelet
  build_pause
  build_k8s_node_tools
  build_kubeadm_addons
  gobin_install crictl "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION" \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
  gobin_install local-path-provisioner \
    "github.com/rancher/local-path-provisioner@$LOCAL_PATH_PROVISIONER_VERSION" \
    "-X main.VERSION=$LOCAL_PATH_PROVISIONER_VERSION"
  # The kind CLI's name carries its version, as the node image's tag does.
  if ! have "kind-$KIND_VERSION"; then
    gobin_install kind "sigs.k8s.io/kind@$KIND_VERSION"
    mv "$BIN/kind" "$BIN/kind-$KIND_VERSION"
  fi
fi
if [ "$WHAT" = all ] || [ "$WHAT" = netpol ] || [ "$WHAT" = kind ]; then
  build_netpol
fi
if [ "$WHAT" = all ] || [ "$WHAT" = kueue ]; then
  # Kueue's manager (queues and quota admission, tests/integration/test_kueue.py). Like the
  # training-operator, its go.mod has no replace directives: `go install` builds it with its
  # own pins. Its CRDs and config are read from the module cache (localkube.kueue).
  if ! have "kueue-$KUEUE_VERSION"; then
    gobin_install kueue "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" \
      "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
    mv "$BIN/kueue" "$BIN/kueue-$KUEUE_VERSION"
  fi
fi
echo "$BIN"
