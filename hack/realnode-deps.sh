#!/usr/bin/env bash
# Installs what localkube's real nodes need when missing (idempotent): containerd (with its runc
# shim and ctr), runc, containernetworking-plugins (bridge, host-local, loopback in /usr/lib/cni)
# and iptables: the group "realnode" of the one list, hack/sysdeps/packages.tsv. Nothing is
# started: each real node runs a containerd of its own (cluster/localkube/realnode.py).
#
#   hack/realnode-deps.sh
set -euo pipefail
exec "$(dirname "$0")/sysdeps/install.sh" --group realnode
