"""NetworkPolicy enforcement on the process node: kube-network-policies, one per node.

The enforcer is sigs.k8s.io/kube-network-policies (its pkg/networkpolicy, the controller that
kind's kindnet embeds), built by `cluster/build.sh netpol` as `kube-network-policies-<version>`.
It runs on the host, beside the control plane, like the other components. For each pod of its
node that a NetworkPolicy selects it puts the pod's IP into a set of an nftables table of its
own (`inet`, a chain on the postrouting hook); the first packet of every connection to or from
such an IP is sent to userspace (nfqueue) and accepted or dropped by evaluating the policies.
Packets between two pods of the bridge `lk-<name>` are bridged, not routed: with br_netfilter
and net.bridge.bridge-nf-call-iptables=1 they pass the IPv4 hooks all the same, so the chain
sees them. (The bridge's own forward_rules in localkube.network must then accept them, as they
do.)

One enforcer per process node, not one per host or per cluster: the enforcer filters the pods
whose spec.nodeName is its node name and nothing else, and several clusters (parallel test
sessions) share one host and its network namespace. So each gets its own table,
`localkube-<bridge>-<node>`, and its own queue number, from the bridge's /16 (unique on the
host) and the node's index. A packet between pods of two nodes passes both tables' chains and
is judged by both, with the same policies and the same verdict.

What upstream's command (cmd/main.go of v0.8.0) cannot do here, and so build.sh builds the
package with a small command of its own: read a kubeconfig (upstream's takes only the
in-cluster config, a ServiceAccount token at a fixed path), and name its table (upstream's is
fixed: two clusters on one host would flush each other's rules). Everything that decides a
packet's fate is upstream's.

What the node is allowed: upstream accepts, before any policy, packets of sockets owned by
root on the node (`meta skuid 0`; kubelet probes, kubernetes-sigs/kube-network-policies#65).
The operator of the tests runs on the host as root, so its reads of the launchers' status port
pass by that rule; on a real cluster it runs in a pod and the job's policy admits it by its
namespace and labels (docs/security.md).

Fail closed: with no enforcer reading a node's queue, the packets its table sends there are
dropped. A stopped enforcer removes its table (SIGTERM); one that was killed leaves it, and
teardown removes it (remove_tables, with `nft`).

The kernel must have nftables' `queue` expression (CONFIG_NFT_QUEUE, module nft_queue): the
enforcer's table cannot be written without it (netlink answers ENOENT, and the enforcer keeps
running with no rules at all, filtering nothing). queue_supported asks the kernel first, so a
cluster asked to enforce on such a host refuses to start instead of pretending; and an
enforcer counts as ready only once its table is there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from localkube.network import PodNetwork

VERSION = os.environ.get("KUBE_NETWORK_POLICIES_VERSION", "v0.8.0")
TABLE_PREFIX = "localkube-"
# The kernel lists the queues that have a listener here: a queue is bound once the enforcer
# has synced its informers and written its table (its Run does both before it binds).
NFQUEUE_PROC = Path("/proc/net/netfilter/nfnetlink_queue")
# The set of local pod IPs that policies select (pkg/networkpolicy, podV4IPsSet).
POD_IPS_V4 = "podips-v4"

Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def binary(bin_dir: Path, version: str = VERSION) -> Path:
    return bin_dir / f"kube-network-policies-{version}"


def component(node: str) -> str:
    """The enforcer's name in pids.json and its log, logs/<component>.log."""
    return f"netpol-{node}"


def table_name(net: PodNetwork, node: str) -> str:
    return f"{TABLE_PREFIX}{net.bridge}-{node}"


def queue_id(net: PodNetwork, node_index: int) -> int:
    """A queue number no other cluster on the host uses: bases are unique per host (no two
    bridges share a /16), node indexes per cluster. Fits nfqueue's 16 bits."""
    if not 0 <= node_index < 256:
        raise ValueError(f"node index out of range: {node_index}")
    return net.base * 256 + node_index


def enforcer_args(
    exe: Path, kubeconfig: Path, net: PodNetwork, node: str, node_index: int
) -> list[str]:
    return [
        str(exe),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node}",
        f"--nfqueue-id={queue_id(net, node_index)}",
        f"--nftables-table={table_name(net, node)}",
        "--v=1",
    ]


def bound_queues(text: str) -> set[int]:
    """Queue numbers with a listener, from /proc/net/netfilter/nfnetlink_queue (one line per
    queue, its number first)."""
    out = set()
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0].isdigit():
            out.add(int(fields[0]))
    return out


def queue_bound(queue: int, proc: Path = NFQUEUE_PROC) -> bool:
    try:
        return queue in bound_queues(proc.read_text())
    except OSError:
        return False


def _run(cmd: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False, timeout=30)


# The one expression of the enforcer's table that kernels may lack, in a table that `nft -c`
# checks with the kernel and never creates.
QUEUE_PROBE = """\
table inet localkube-queue-probe {
  chain postrouting {
    type filter hook postrouting priority srcnat - 5;
    meta l4proto tcp queue num 1 bypass
  }
}
"""
NO_QUEUE = (
    "this kernel cannot queue packets from nftables (no `queue` expression: CONFIG_NFT_QUEUE, "
    "module nft_queue), so kube-network-policies cannot write its rules here"
)


def queue_supported() -> str | None:
    """None when the kernel accepts an nftables `queue` rule; else why not. Needs `nft`."""
    if shutil.which("nft") is None:
        return "no `nft` (Debian package nftables) to ask the kernel with"
    out = _run(["nft", "-c", "-f", "-"], stdin=QUEUE_PROBE)
    if out.returncode == 0:
        return None
    errors = [line.strip() for line in out.stderr.splitlines() if "Error" in line]
    return f"{NO_QUEUE} (nft -c: {errors[0] if errors else f'exit {out.returncode}'})"


def table_exists(net: PodNetwork, node: str, run: Runner = _run) -> bool:
    return run(["nft", "list", "table", "inet", table_name(net, node)]).returncode == 0


def parse_tables(nft_json: str) -> list[str]:
    """Names of the inet tables in `nft -j list tables`."""
    try:
        doc = json.loads(nft_json)
    except ValueError:
        return []
    items = doc.get("nftables", []) if isinstance(doc, dict) else []
    return [
        str(i["table"]["name"])
        for i in items
        if isinstance(i, dict)
        and isinstance(i.get("table"), dict)
        and i["table"].get("family") == "inet"
        and "name" in i["table"]
    ]


def cluster_tables(names: list[str], net: PodNetwork) -> list[str]:
    prefix = f"{TABLE_PREFIX}{net.bridge}-"
    return [n for n in names if n.startswith(prefix)]


def parse_set_elements(nft_json: str) -> set[str]:
    """The addresses in `nft -j list set inet <table> <set>`."""
    try:
        doc = json.loads(nft_json)
    except ValueError:
        return set()
    items = doc.get("nftables", []) if isinstance(doc, dict) else []
    out: set[str] = set()
    for i in items:
        s = i.get("set") if isinstance(i, dict) else None
        if not isinstance(s, dict):
            continue
        for elem in s.get("elem") or []:
            if isinstance(elem, str):
                out.add(elem)
    return out


def enforced_ips(net: PodNetwork, node: str, run: Runner = _run) -> set[str]:
    """The pod IPs the node's enforcer filters now (those a policy selects); empty when its
    table is not there."""
    out = run(["nft", "-j", "list", "set", "inet", table_name(net, node), POD_IPS_V4])
    return parse_set_elements(out.stdout) if out.returncode == 0 else set()


def remove_tables(net: PodNetwork, run: Runner = _run) -> list[str]:
    """Deletes the cluster's enforcer tables that a killed enforcer left behind (their chains
    would send packets of these addresses to a queue nobody reads: dropped). Without `nft`
    there is nothing to list them with; an enforcer removes its own table when it stops."""
    if shutil.which("nft") is None:
        return []
    listed = run(["nft", "-j", "list", "tables"])
    if listed.returncode != 0:
        return []
    removed = []
    for name in cluster_tables(parse_tables(listed.stdout), net):
        if run(["nft", "delete", "table", "inet", name]).returncode == 0:
            removed.append(f"nft table inet {name}")
    return removed
