#!/bin/bash
# The CNI of our kind node image, in place of kind's kindnet (which the Go module proxy does not
# serve): a DaemonSet (default-cni.yaml) runs this on every node, host network. It does what
# kindnet does for a cluster on one Docker network, with Debian's CNI plugins:
#
#   - writes /etc/cni/net.d/10-kind-bridge.conflist for its node: the `bridge` plugin (bridge
#     kind-br0, the node's gateway address, hairpin mode) with `host-local` addresses from the
#     node's spec.podCIDR, then `portmap` (hostPort);
#   - routes every other node's podCIDR through that node's InternalIP (all nodes share one L2
#     network, Docker's `kind` network), and removes its routes to nodes that are gone;
#   - masquerades what pods send outside the pod subnet (e.g. to the Docker host).
#
# Every 10 s, idempotently. No NetworkPolicy enforcement (kindnet has it), IPv4 only.
#
# Environment: NODE_NAME (the downward API), POD_SUBNET (kind's networking.podSubnet, filled in
# by kind's manifest template), CONTROL_PLANE_ENDPOINT (host:port, added by kind, so that this
# works before kube-proxy programs the `kubernetes` Service), CNI_CONF_DIR.
set -euo pipefail
: "${NODE_NAME:?}" "${POD_SUBNET:?}"
conf_dir=${CNI_CONF_DIR:-/etc/cni/net.d}
conf=$conf_dir/10-kind-bridge.conflist
sa=/var/run/secrets/kubernetes.io/serviceaccount
server=https://${CONTROL_PLANE_ENDPOINT:-$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT}
# Routes this daemon owns carry their own protocol number, so stale ones can be found.
proto=77
comment="kind-bridge-cni: masquerade pod traffic leaving the pod subnet"

kubeconfig=$(mktemp)
cat >"$kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", certificate-authority: $sa/ca.crt}}]
users: [{name: u, user: {tokenFile: $sa/token}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
EOF
kc() { kubectl --kubeconfig="$kubeconfig" --request-timeout=10s "$@"; }
log() { echo "$(date -u +%FT%TZ) $*"; }

write_conf() {  # podCIDR
  local tmp
  tmp=$(mktemp -p "$conf_dir" .conflist.XXXXXX)
  cat >"$tmp" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "kind-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "kind-br0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$1"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  if cmp -s "$tmp" "$conf"; then
    rm -f "$tmp"
  else
    chmod 0644 "$tmp"
    mv "$tmp" "$conf"
    log "wrote $conf for podCIDR $1"
  fi
}

sync_routes() {
  local name cidr ip want=" "
  while read -r name cidr ip; do
    if [ "$name" = "$NODE_NAME" ] || [ -z "$cidr" ] || [ -z "$ip" ]; then
      continue
    fi
    want="$want$cidr "
    if ! ip route show "$cidr" proto "$proto" | grep -q "via $ip "; then
      ip route replace "$cidr" via "$ip" proto "$proto"
      log "route $cidr via $ip (node $name)"
    fi
  done < <(kc get nodes -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.podCIDR}{" "}{.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}')
  while read -r cidr _; do
    if [ -n "$cidr" ] && [[ $want != *" $cidr "* ]]; then
      ip route del "$cidr" proto "$proto"
      log "removed route $cidr (node gone)"
    fi
  done < <(ip route show proto "$proto")
}

masquerade() {  # podCIDR
  local rule=(-s "$1" ! -d "$POD_SUBNET" -m comment --comment "$comment" -j MASQUERADE)
  iptables -t nat -C POSTROUTING "${rule[@]}" 2>/dev/null || iptables -t nat -A POSTROUTING "${rule[@]}"
}

log "node $NODE_NAME, pod subnet $POD_SUBNET, API server $server"
mkdir -p "$conf_dir"
while true; do
  if own=$(kc get node "$NODE_NAME" -o jsonpath='{.spec.podCIDR}') && [ -n "$own" ]; then
    write_conf "$own"
    masquerade "$own"
    sync_routes || log "routes not synced this round"
  else
    log "waiting for node $NODE_NAME's podCIDR"
  fi
  sleep 10
done
