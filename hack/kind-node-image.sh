#!/usr/bin/env bash
# Builds a kind node image for Kubernetes $K8S_VERSION on a machine with no image registry, and
# prints its name (default local/kind-node:$K8S_VERSION). `kind build node-image` cannot work
# here: it starts from kindest/base (a registry) and pulls etcd, CoreDNS, pause, kindnet and
# local-path-provisioner. This does what it does, from parts made here:
#
#   base  local/kind-base:$KIND_VERSION-$SUITE, what kind's images/base/Dockerfile makes, from
#         Debian packages (mmdebstrap) instead of debian:trixie-slim and GitHub: systemd,
#         containerd, runc, Debian's CNI plugins and kind's package list, with kind's own files
#         (entrypoint, systemd units, containerd config; images/base/files of the
#         sigs.k8s.io/kind module) and crictl built from its Go module.
#   node  what `kind build node-image` adds to the base: kubeadm, kubelet and kubectl in
#         /usr/bin, /kind/version, /kind/manifests/default-{cni,storage}.yaml and the images
#         kubeadm deploys, imported into the node's containerd (pinned, not unpacked).
#
# Component images, named as `kubeadm config images list` says (docker import of a small root
# filesystem with the static binary, built from Go modules by `cluster/build.sh kind`):
# kube-apiserver, kube-controller-manager, kube-scheduler, etcd, coredns, pause; kube-proxy on
# Debian with iptables. In place of kindnet: images/kind-node/default-cni.yaml (bridge-cni.sh,
# Debian's CNI plugins; netpol.sh, NetworkPolicy by kube-network-policies). Storage: kind's local-path manifest with local-path-provisioner built
# here. What differs from upstream kind: docs/install.md, "kind".
#
#   hack/kind-node-image.sh [IMAGE]
#
# Cached: every image carries a label with the hash of its recipe (the shell function that
# makes it and its inputs) and is rebuilt only when that changes, or with FORCE=1.
#   K8S_VERSION   default v1.37.2 (the control plane's; cluster/build.sh)
#   KIND_VERSION  default v0.33.0 (the sigs.k8s.io/kind module whose files the base uses)
#   SUITE MIRROR SECURITY_MIRROR   Debian (default bookworm: systemd 252 still runs on
#                 cgroup v1, which these machines have; trixie's systemd 257 does not by default)
#   DOCKER        the docker CLI
# Needs: root, Docker (hack/docker.sh), mmdebstrap (apt), Go; network: the Go module proxy
# and deb.debian.org.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=images/base/minbase.sh
. images/base/minbase.sh
export K8S_VERSION=${K8S_VERSION:-v1.37.2}
export KIND_VERSION=${KIND_VERSION:-v0.33.0}
export KUBE_NETWORK_POLICIES_VERSION=${KUBE_NETWORK_POLICIES_VERSION:-v0.8.0}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
NODE_IMAGE=${1:-local/kind-node:$K8S_VERSION}
docker=${DOCKER:-docker}
LABEL=dev.torchrun.kind-recipe
HERE=images/kind-node

log() { echo "[kind-node] $*" >&2; }
die() { echo "hack/kind-node-image.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap, docker)"
"$docker" info >/dev/null 2>&1 || die "no Docker engine answers (start one with hack/docker.sh)"
hack/sysdeps/install.sh mmdebstrap iptables || die "cannot install mmdebstrap (hack/sysdeps/install.sh)"

BIN=$(cluster/build.sh kind) || die "cluster/build.sh kind failed (the Go builds; output above)"
KIND_SRC=$(go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') ||
  die "cannot download sigs.k8s.io/kind@$KIND_VERSION from the Go module proxy"
KIND_FILES=$KIND_SRC/images/base/files
[ -f "$KIND_FILES/usr/local/bin/entrypoint" ] || die "no kind node files in $KIND_FILES"

# What kubeadm deploys, e.g. registry.k8s.io/etcd:3.7.0-0.
mapfile -t KUBEADM_IMAGES < <("$BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION")
kubeadm_image() {  # name -> the full reference kubeadm uses
  local i
  for i in "${KUBEADM_IMAGES[@]}"; do
    if [[ ${i%:*} == */$1 ]]; then echo "$i"; return; fi
  done
  die "kubeadm $K8S_VERSION lists no $1 image: ${KUBEADM_IMAGES[*]}"
}
PAUSE_IMAGE=$(kubeadm_image pause)
ETCD_IMAGE=$(kubeadm_image etcd)
COREDNS_IMAGE=$(kubeadm_image coredns)
ETCD_BIN=$BIN/etcd-v${ETCD_IMAGE##*:}
ETCD_BIN=${ETCD_BIN%-*}
COREDNS_BIN=$BIN/coredns-${COREDNS_IMAGE##*:}
LPP_VERSION=$("$BIN/local-path-provisioner" --version 2>/dev/null | awk '{print $NF}')
BASE_IMAGE=local/kind-base:$KIND_VERSION-$SUITE
NETBASE_IMAGE=local/kind-netbase:$SUITE
CNI_IMAGE=local/kind-bridge-cni:$K8S_VERSION
NETPOL_BIN=$BIN/kube-network-policies-$KUBE_NETWORK_POLICIES_VERSION
NETPOL_IMAGE=local/kind-netpol:$KUBE_NETWORK_POLICIES_VERSION
LPP_IMAGE=local/kind-local-path-provisioner:$LPP_VERSION
LPP_HELPER_IMAGE=local/kind-local-path-helper:$SUITE

# recipe NAME INPUT...: a hash of the function NAME's text and the inputs (strings or files).
recipe() {
  local fn=$1
  shift
  {
    declare -f "$fn"
    for x in "$@"; do
      if [ -f "$x" ]; then sha256sum "$x"; else echo "$x"; fi
    done
  } | sha256sum | cut -c1-16
}
# fresh IMAGE HASH: IMAGE exists and was made by this recipe.
fresh() {
  [ "${FORCE:-0}" != 1 ] &&
    [ "$("$docker" image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null)" = "$2" ]
}

debian_rootfs() {  # packages hook... : mmdebstrap's tarball on stdout
  local packages=$1
  shift
  local hooks=()
  for h in "$@"; do hooks+=(--customize-hook="$h"); done
  minbase_rootfs "$SUITE" "$MIRROR" "$SECURITY_MIRROR" "$packages" "${hooks[@]}"
}

# kind's images/base/Dockerfile, on Debian packages: its package list (containerd, runc and
# the CNI plugins from Debian instead of GitHub builds), its files, its systemd setup.
NODE_PACKAGES=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,fuse-overlayfs,nfs-common,open-iscsi,e2fsprogs,bash,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins
build_base() {
  local hook
  hook=$(mktemp)
  cat >"$hook" <<'HOOK'
#!/bin/bash
# mmdebstrap customize hook: $1 is the root filesystem; KIND_FILES and CRICTL from the caller.
set -euo pipefail
exec >&2  # mmdebstrap writes the tarball to stdout
r=$1
# kind's files, with the modes its Dockerfile gives them (scripts 0755, the rest 0644).
install -d -m 0755 "$r/kind" "$r/kind/bin" "$r/LICENSES" "$r/etc/containerd" \
  "$r/etc/systemd/system/kubelet.service.d"
install -m 0755 "$KIND_FILES"/usr/local/bin/* "$r/usr/local/bin/"
install -m 0755 "$KIND_FILES"/kind/bin/* "$r/kind/bin/"
install -m 0644 "$KIND_FILES"/kind/README.txt "$r/kind/"
install -m 0644 "$KIND_FILES"/LICENSES/* "$r/LICENSES/"
install -m 0644 "$KIND_FILES"/etc/crictl.yaml "$r/etc/"
install -m 0644 "$KIND_FILES"/etc/containerd/* "$r/etc/containerd/"
install -m 0644 "$KIND_FILES"/etc/default/* "$r/etc/default/"
install -m 0644 "$KIND_FILES"/etc/sysctl.d/* "$r/etc/sysctl.d/"
find "$KIND_FILES/etc/systemd/system" -maxdepth 1 -type f -exec install -m 0644 {} "$r/etc/systemd/system/" \;
install -m 0644 "$KIND_FILES"/etc/systemd/system/kubelet.service.d/* "$r/etc/systemd/system/kubelet.service.d/"
# Not kind's: these machines refuse to lower oom_score_adj, even to root with every
# capability (EACCES); kind's entrypoint sets this only in a user namespace.
sed -i 's/^\(\s*restrict_oom_score_adj = \)false/  # these hosts refuse to lower oom_score_adj, even to root\n\1true/' \
  "$r/etc/containerd/config.toml"
grep -q 'restrict_oom_score_adj = true' "$r/etc/containerd/config.toml"
# Where kind's units and containerd look for what it builds from GitHub: Debian's packages.
ln -sf /usr/bin/containerd "$r/usr/local/bin/containerd"
install -d -m 0755 "$r/opt/cni/bin"
for p in "$r"/usr/lib/cni/*; do ln -sf "/usr/lib/cni/${p##*/}" "$r/opt/cni/bin/"; done
install -m 0755 "$CRICTL" "$r/usr/local/bin/crictl"
# The rest of kind's Dockerfile.
chroot "$r" ctr oci spec |
  chroot "$r" jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
  chroot "$r" jq 'del(.process.rlimits)' >"$r/etc/containerd/cri-base.json"
find "$r/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$r"/lib/systemd/system/multi-user.target.wants/* "$r"/etc/systemd/system/*.wants/* \
  "$r"/lib/systemd/system/local-fs.target.wants/* "$r"/lib/systemd/system/sockets.target.wants/*udev* \
  "$r"/lib/systemd/system/sockets.target.wants/*initctl* "$r"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$r/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$r/sbin/init"
chroot "$r" systemctl enable kubelet.service containerd.service undo-mount-hacks.service
chroot "$r" systemctl mask systemd-binfmt.service
install -d -m 0755 "$r/etc/kubernetes/manifests"
HOOK
  chmod +x "$hook"
  log "$BASE_IMAGE: Debian $SUITE + kind $KIND_VERSION's node files"
  export KIND_FILES CRICTL=$BIN/crictl
  debian_rootfs "$NODE_PACKAGES" "$hook \"\$1\"" |
    "$docker" import --message "kind $KIND_VERSION base on Debian $SUITE" - "$BASE_IMAGE.rootfs" >/dev/null
  rm -f "$hook"
  # The metadata of kind's base image (docker import cannot set STOPSIGNAL).
  "$docker" build -q -t "$BASE_IMAGE" - >/dev/null <<EOF
FROM $BASE_IMAGE.rootfs
# systemd, told that it runs in a container (https://systemd.io/CONTAINER_INTERFACE/), stops
# on SIGRTMIN+3
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
LABEL $LABEL=$1
EOF
  "$docker" rmi "$BASE_IMAGE.rootfs" >/dev/null
}

# Debian with iptables for what changes the node's rules (kube-proxy, bridge-cni), with
# iptables-wrapper picking the node's backend. Also local-path-provisioner's helper (sh, mkdir).
NET_PACKAGES=iptables,nftables,conntrack,iproute2
build_netbase() {
  local wrapper=$PWD/$HERE/iptables-wrapper
  log "$NETBASE_IMAGE: Debian $SUITE + $NET_PACKAGES"
  debian_rootfs "$NET_PACKAGES" \
    "for n in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do ln -sf iptables-wrapper \"\$1/usr/sbin/\$n\"; done" \
    "install -m 0755 '$wrapper' \"\$1/usr/sbin/iptables-wrapper\"" |
    "$docker" import --change "LABEL $LABEL=$1" --message "Debian $SUITE: $NET_PACKAGES" \
      - "$NETBASE_IMAGE" >/dev/null
}

# A root filesystem with one static binary (and passwd, group, nsswitch.conf, /tmp).
static_image() {  # hash tag binary path-in-image [docker import --change ...]
  local hash=$1 tag=$2 binary=$3 dest=$4 root
  shift 4
  root=$(mktemp -d)
  install -d -m 0755 "$root/etc" "$root${dest%/*}"
  install -d -m 1777 "$root/tmp"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
    'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$root/etc/group"
  echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
  install -m 0755 "$binary" "$root$dest"
  tar --numeric-owner --owner=0 --group=0 -C "$root" -c . |
    "$docker" import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
      --change "LABEL $LABEL=$hash" "$@" - "$tag" >/dev/null
  rm -rf "$root"
}

# FROM the netbase, plus files (a Dockerfile on stdin; the context is images/kind-node and the
# binaries named).
netbase_image() {  # hash tag binary...
  local hash=$1 tag=$2 ctx
  shift 2
  ctx=$(mktemp -d)
  cp "$HERE"/* "$ctx/"
  for b in "$@"; do cp "$b" "$ctx/"; done
  cat >"$ctx/Dockerfile"
  echo "LABEL $LABEL=$hash" >>"$ctx/Dockerfile"
  "$docker" build -q -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
}

build_images() {
  local h
  h=$(recipe static_image "$BIN/kube-apiserver" "$BIN/kube-controller-manager" "$BIN/kube-scheduler")
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    local img
    img=$(kubeadm_image "$c")
    fresh "$img" "$h" && continue
    log "$img"
    static_image "$h" "$img" "$BIN/$c" "/usr/local/bin/$c" --change "ENTRYPOINT [\"/usr/local/bin/$c\"]"
  done
  h=$(recipe static_image "$ETCD_BIN")
  fresh "$ETCD_IMAGE" "$h" || {
    log "$ETCD_IMAGE"
    static_image "$h" "$ETCD_IMAGE" "$ETCD_BIN" /usr/local/bin/etcd --change 'ENTRYPOINT ["/usr/local/bin/etcd"]'
  }
  h=$(recipe static_image "$COREDNS_BIN")
  fresh "$COREDNS_IMAGE" "$h" || {
    log "$COREDNS_IMAGE"
    static_image "$h" "$COREDNS_IMAGE" "$COREDNS_BIN" /coredns \
      --change 'ENTRYPOINT ["/coredns"]' --change 'EXPOSE 53 53/udp'
  }
  h=$(recipe static_image "$BIN/pause")
  fresh "$PAUSE_IMAGE" "$h" || {
    log "$PAUSE_IMAGE"
    static_image "$h" "$PAUSE_IMAGE" "$BIN/pause" /pause --change 'ENTRYPOINT ["/pause"]' \
      --change 'USER 65535:65535'
  }
  h=$(recipe static_image "$BIN/local-path-provisioner")
  fresh "$LPP_IMAGE" "$h" || {
    log "$LPP_IMAGE"
    static_image "$h" "$LPP_IMAGE" "$BIN/local-path-provisioner" /usr/local/bin/local-path-provisioner \
      --change 'ENTRYPOINT ["/usr/local/bin/local-path-provisioner"]'
  }

  h=$(recipe build_netbase "$SUITE" "$NET_PACKAGES" "$HERE/iptables-wrapper")
  fresh "$NETBASE_IMAGE" "$h" || build_netbase "$h"
  local nb=$h
  local proxy
  proxy=$(kubeadm_image kube-proxy)
  h=$(recipe netbase_image "$nb" "$BIN/kube-proxy")
  fresh "$proxy" "$h" || {
    log "$proxy"
    netbase_image "$h" "$proxy" "$BIN/kube-proxy" <<EOF
FROM $NETBASE_IMAGE
COPY kube-proxy /usr/local/bin/kube-proxy
ENTRYPOINT ["/usr/local/bin/kube-proxy"]
EOF
  }
  h=$(recipe netbase_image "$nb" "$BIN/kubectl" "$HERE/bridge-cni.sh")
  fresh "$CNI_IMAGE" "$h" || {
    log "$CNI_IMAGE"
    netbase_image "$h" "$CNI_IMAGE" "$BIN/kubectl" <<EOF
FROM $NETBASE_IMAGE
COPY kubectl bridge-cni.sh /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/bridge-cni.sh"]
EOF
  }
  h=$(recipe netbase_image "$nb" "$NETPOL_BIN" "$HERE/netpol.sh")
  fresh "$NETPOL_IMAGE" "$h" || {
    log "$NETPOL_IMAGE"
    netbase_image "$h" "$NETPOL_IMAGE" "$NETPOL_BIN" <<EOF
FROM $NETBASE_IMAGE
COPY ${NETPOL_BIN##*/} /usr/local/bin/kube-network-policies
COPY netpol.sh /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/netpol.sh"]
EOF
  }
  h=$(recipe netbase_image "$nb")
  fresh "$LPP_HELPER_IMAGE" "$h" || {
    log "$LPP_HELPER_IMAGE"
    netbase_image "$h" "$LPP_HELPER_IMAGE" <<EOF
FROM $NETBASE_IMAGE
EOF
  }
}

# kind's default storage manifest (pkg/build/nodeimage/const_storage.go of the module) with our
# provisioner and helper images in place of kind's.
storage_manifest() {
  python3 - "$KIND_SRC/pkg/build/nodeimage/const_storage.go" "$LPP_IMAGE" "$LPP_HELPER_IMAGE" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
consts = dict(re.findall(r'^const (\w+) = "([^"]*)"$', src, re.M))
consts["storageProvisionerImage"], consts["storageHelperImage"] = sys.argv[2], sys.argv[3]
rest = src[src.index("const defaultStorageManifest = ") + len("const defaultStorageManifest = "):]
out = []
while True:
    m = re.match(r'\s*(?:`([^`]*)`|(\w+))', rest)
    if not m:
        sys.exit("const_storage.go: cannot read defaultStorageManifest")
    out.append(m.group(1) if m.group(1) is not None else consts[m.group(2)])
    rest = rest[m.end():]
    plus = re.match(r'\s*\+', rest)
    if not plus:
        break
    rest = rest[plus.end():]
sys.stdout.write("".join(out))
PY
}

NODE_IMAGES=()
build_node() {
  local hash=$1 cid image
  cid=$("$docker" run -d --entrypoint=sleep --security-opt seccomp=unconfined \
    --name "kind-build-$(date +%s)-$$" "$BASE_IMAGE" infinity)
  # shellcheck disable=SC2064  # cid is known now
  trap "'$docker' rm -f -v '$cid' >/dev/null 2>&1 || true" EXIT
  node_exec() { "$docker" exec -i "$cid" "$@"; }
  log "$NODE_IMAGE: in container ${cid:0:12}"
  for b in kubeadm kubelet kubectl; do
    "$docker" cp "$BIN/$b" "$cid:/usr/bin/$b"
    node_exec chmod 0755 "/usr/bin/$b"
    node_exec chown root:root "/usr/bin/$b"
  done
  printf '%s' "$K8S_VERSION" | node_exec cp /dev/stdin /kind/version
  node_exec mkdir -p /kind/manifests
  sed -e "s#@CNI_IMAGE@#$CNI_IMAGE#" -e "s#@NETPOL_IMAGE@#$NETPOL_IMAGE#" "$HERE/default-cni.yaml" |
    node_exec cp /dev/stdin /kind/manifests/default-cni.yaml
  storage_manifest | node_exec cp /dev/stdin /kind/manifests/default-storage.yaml
  # The sandbox image: kubeadm's pause (kind's base config names an older one and pulls it).
  node_exec sed -i "s#sandbox_image = .*#sandbox_image = \"$PAUSE_IMAGE\"#" /etc/containerd/config.toml
  # The images, as kind's builder imports them: pinned (no image garbage collection), not
  # unpacked (the CRI unpacks on first use; the build container's overlayfs cannot hold
  # overlayfs snapshots).
  node_exec bash -c 'nohup containerd >/tmp/containerd.log 2>&1 &'
  # shellcheck disable=SC2016  # expanded in the container
  node_exec bash -c 'for i in $(seq 50); do [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 && exit 0; sleep 0.2; done; cat /tmp/containerd.log; exit 1' ||
    die "containerd did not start in the build container"
  for image in "${NODE_IMAGES[@]}"; do
    "$docker" save "$image" |
      node_exec ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned \
        --all-platforms --no-unpack --digests - >/dev/null ||
      die "cannot import $image into the node's containerd"
  done
  node_exec ctr --namespace=k8s.io images list -q | grep -v '^sha256:' | sed 's/^/[kind-node]   /' >&2
  # shellcheck disable=SC2016  # expanded in the container
  # (sleep, PID 1 here, reaps no child: containerd stays a zombie)
  node_exec bash -c 'pkill -x containerd; for i in $(seq 50); do ps -C containerd -o stat= | grep -qv "^Z" || exit 0; sleep 0.2; done; exit 1' ||
    die "containerd did not stop in the build container"
  "$docker" commit \
    --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' \
    --change "LABEL $LABEL=$hash" \
    "$cid" "$NODE_IMAGE" >/dev/null
  "$docker" rm -f -v "$cid" >/dev/null
  trap - EXIT
}

start=$(date +%s)
base_hash=$(recipe build_base "$SUITE" "$NODE_PACKAGES" "$KIND_VERSION" "$BIN/crictl")
fresh "$BASE_IMAGE" "$base_hash" || build_base "$base_hash"
build_images
NODE_IMAGES=(
  "$(kubeadm_image kube-apiserver)" "$(kubeadm_image kube-controller-manager)"
  "$(kubeadm_image kube-scheduler)" "$(kubeadm_image kube-proxy)"
  "$ETCD_IMAGE" "$COREDNS_IMAGE" "$PAUSE_IMAGE" "$CNI_IMAGE" "$NETPOL_IMAGE" "$LPP_IMAGE"
  "$LPP_HELPER_IMAGE"
)
ids=()
for image in "${NODE_IMAGES[@]}"; do ids+=("$("$docker" image inspect -f '{{.Id}}' "$image")"); done
node_hash=$(recipe build_node "$base_hash" "${ids[@]}" "$BIN/kubeadm" "$BIN/kubelet" "$BIN/kubectl" \
  "$HERE/default-cni.yaml" "$(declare -f storage_manifest)")
if fresh "$NODE_IMAGE" "$node_hash"; then
  log "$NODE_IMAGE is up to date"
else
  build_node "$node_hash"
  log "$NODE_IMAGE built in $(($(date +%s) - start))s"
fi
echo "$NODE_IMAGE"
