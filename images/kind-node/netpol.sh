#!/bin/bash
# NetworkPolicy on our kind nodes, in place of kindnet's (kindnet embeds the same enforcer): a
# DaemonSet (default-cni.yaml) runs this on every node, host network. It runs
# kube-network-policies, built as for the local cluster (cluster/netpol/main.go: upstream's
# pkg/networkpolicy decides every packet), and feeds it as localkube feeds its own
# (cluster/localkube/netpol.py), because the kernels of this project's machines have no
# nftables `queue` expression (CONFIG_NFT_QUEUE unset), which upstream's own table needs: one
# iptables rule sends the first packet of every new connection into this node's pods (out
# through the pod bridge, kind-br0: bridged from a pod of this node, seen through br_netfilter,
# or routed from another node) to the enforcer's nfqueue.
#
# Not judged, as upstream judges them not:
#   - sockets of root on the node (`! --uid-owner 0`; upstream's `meta skuid 0 accept`, its rule
#     for the kubelet's probes);
#   - the Docker host, the node's default gateway: kind's nodes reach nothing else through it,
#     and it is where the integration tests run the operator (as on the local cluster, whose
#     host root is exempt); an operator in a pod is admitted by the job's policy.
# `--queue-bypass`: packets pass while no enforcer reads the queue (fail open, as localkube's
# rule: a restarting enforcer must not cut every pod off). The rule goes when this stops.
#
# Environment: NFQUEUE_ID (default 100), BRIDGE (default kind-br0, bridge-cni.sh's),
# CONTROL_PLANE_ENDPOINT (host:port, added by kind: the API server without kube-proxy).
set -euo pipefail
queue=${NFQUEUE_ID:-100}
bridge=${BRIDGE:-kind-br0}
log() { echo "$(date -u +%FT%TZ) $*"; }

host=$(ip -4 route show default | awk '{print $3; exit}')
[ -n "$host" ] || { log "no default route: cannot tell the Docker host's address"; exit 1; }
comment="kind-netpol: new connections into this node's pods, to kube-network-policies"
rule=(-o "$bridge" -m conntrack --ctstate NEW -m owner ! --uid-owner 0 ! -s "$host"
  -m comment --comment "$comment" -j NFQUEUE --queue-num "$queue" --queue-bypass)

remove_rule() { while iptables -t mangle -D POSTROUTING "${rule[@]}" 2>/dev/null; do :; done; }
remove_rule # a previous container's, if it was killed
iptables -t mangle -I POSTROUTING "${rule[@]}"
log "queueing new connections out of $bridge (not from $host, not root's) to nfqueue $queue"

if [ -n "${CONTROL_PLANE_ENDPOINT:-}" ]; then # in-cluster config, not through the Service
  export KUBERNETES_SERVICE_HOST=${CONTROL_PLANE_ENDPOINT%:*}
  export KUBERNETES_SERVICE_PORT=${CONTROL_PLANE_ENDPOINT##*:}
fi
# A node name that no Node has: upstream's nftables table (which cannot be written here, one
# log line at start) then selects no pod, and the verdicts look both ends up among all pods.
/usr/local/bin/kube-network-policies --hostname-override=kind-netpol-judges-by-address \
  --nfqueue-id="$queue" --v=1 &
pid=$!
# shellcheck disable=SC2329  # the trap calls it
stop() {
  remove_rule
  kill -TERM "$pid" 2>/dev/null || true
}
trap stop TERM INT
status=0
wait "$pid" || status=$?
# `wait` returns early when a trapped signal arrives: wait for the enforcer itself.
wait "$pid" 2>/dev/null || true
remove_rule
log "kube-network-policies exited ($status)"
exit "$status"
