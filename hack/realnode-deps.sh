#!/usr/bin/env bash
# Installs what localkube's real nodes need from Debian when missing (idempotent): containerd
# (with its runc shim and ctr), runc and containernetworking-plugins (bridge, host-local,
# loopback in /usr/lib/cni). Nothing is started: each real node runs a containerd of its own
# (cluster/localkube/realnode.py). Needs root and apt for an install.
#
#   hack/realnode-deps.sh
#
# Debian's docker.io depends on containerd and runc, so beside hack/docker.sh only the CNI
# plugins are new.
set -euo pipefail

need=()
for prog in containerd containerd-shim-runc-v2 ctr; do
  command -v "$prog" >/dev/null || { need+=(containerd); break; }
done
command -v runc >/dev/null || need+=(runc)
for plugin in bridge host-local loopback; do
  [ -x "/usr/lib/cni/$plugin" ] || { need+=(containernetworking-plugins); break; }
done
if ((${#need[@]} == 0)); then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "hack/realnode-deps.sh: missing ${need[*]}, and installing needs root" >&2
  exit 1
fi
echo "[realnode] installing ${need[*]} (apt)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
