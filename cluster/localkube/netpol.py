"""NetworkPolicy enforcement on the process node: kube-network-policies, one per cluster.

The enforcer is sigs.k8s.io/kube-network-policies (its pkg/networkpolicy, the controller that
kind's kindnet embeds), built by `cluster/build.sh netpol` as `kube-network-policies-<version>`
with the command in cluster/netpol/main.go. It runs on the host, beside the control plane.
The first packet of each new connection is handed to it through an nfqueue; it looks the
source and destination addresses up among the cluster's pods, evaluates the NetworkPolicies
that select either (egress of the source, ingress of the destination) and accepts or drops.
Everything that decides a packet's fate is upstream's.

What sends packets to the queue is ours: one iptables rule (queue_rule), in mangle POSTROUTING,
for new connections that leave through the cluster's bridge `lk-<name>`. Upstream writes an
nftables table for that, and the kernels of this project's machines lack nftables' `queue`
expression (CONFIG_NFT_QUEUE unset: the table write fails with ENOENT and nothing would be
filtered), while iptables' NFQUEUE target (xt_NFQUEUE, through nft_compat) is there. So the
one path, here and everywhere, is iptables; cluster/netpol/main.go names the enforcer's node
NO_NODE, a name no Node can have, so that its table (where a kernel lets it write one) holds
no pod and queues nothing, and so that no pod or policy event makes it rewrite the table: it
tries once at start and once at exit, one log line each.

What the rule catches: packets between two pods of the bridge are bridged, not routed, and
with br_netfilter and net.bridge.bridge-nf-call-iptables=1 they pass the IPv4 hooks with the
bridge as their output interface; the host's own connections to pods are routed out of it.
Pods' connections to the host (the apiserver at the bridge address, DNS) are delivered
locally, never through POSTROUTING: as upstream's postrouting chain, this judges traffic to
pods, and pod-to-pod egress. Like upstream's `meta skuid 0 accept`
(kubernetes-sigs/kube-network-policies#65: kubelet probes, node daemons), sockets of the
host's root are exempt: `-m owner ! --uid-owner 0` matches every packet but those (a packet
with no local socket, bridged from a pod, matches). The operator of the tests runs on the host
as root, so its reads of the launchers' status ports pass by that exemption; on a real cluster
it runs in a pod and the job's policy admits it by its namespace and labels
(docs/security.md).

One enforcer per cluster, not per node: upstream's verdict uses every pod of the cluster, on
any node (its node name only picks the pods of its nftables set), and every process node of a
cluster shares one host and one bridge. Several clusters (parallel test sessions) share the
host: each has its own bridge, rule and queue number (from the bridge's /16, unique on the
host).

Fail open: the rule carries --queue-bypass, so while no enforcer reads the queue (not started
yet, or dead) packets pass unjudged instead of being dropped. A dead enforcer must not make
every test's connections time out, and a test of enforcement first checks that the queue is
bound (queue_bound). The rule is removed with the cluster, a killed one's included
(remove_queue_rules, by its comment, as localkube.network removes its rules).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from localkube.network import PodNetwork, Runner, _iptables

VERSION = os.environ.get("KUBE_NETWORK_POLICIES_VERSION", "v0.8.0")
COMPONENT = "netpol"  # in pids.json, and its log: logs/netpol.log
# The enforcer's node name: not a DNS subdomain, so no Node has it (see above).
NO_NODE = "localkube:iptables-queue"
# The kernel lists the queues that have a listener here: the enforcer binds its queue once its
# informers have synced (its Run waits for them first).
NFQUEUE_PROC = Path("/proc/net/netfilter/nfnetlink_queue")
CHAIN = ("-t", "mangle", "POSTROUTING")


def binary(bin_dir: Path, version: str = VERSION) -> Path:
    return bin_dir / f"kube-network-policies-{version}"


def table_name(net: PodNetwork) -> str:
    """The enforcer's own nftables table: per cluster, so that two clusters' enforcers, where
    a kernel lets them write one, never flush each other's."""
    return f"localkube-{net.bridge}"


def queue_id(net: PodNetwork) -> int:
    """A queue number no other cluster on the host uses (no two bridges share a /16). Fits
    nfqueue's 16 bits."""
    return net.base * 256


def enforcer_args(exe: Path, kubeconfig: Path, net: PodNetwork) -> list[str]:
    return [
        str(exe),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={NO_NODE}",
        f"--nfqueue-id={queue_id(net)}",
        f"--nftables-table={table_name(net)}",
        "--v=1",
    ]


def _tag(net: PodNetwork) -> list[str]:
    return ["-m", "comment", "--comment", f"localkube {net.bridge} netpol"]


def queue_rule(net: PodNetwork) -> list[str]:
    """The mangle POSTROUTING rule (without its chain): new connections out of the bridge,
    but the host root's, go to the enforcer's queue; past it while nobody listens."""
    return [
        *["-o", net.bridge, "-m", "conntrack", "--ctstate", "NEW"],
        *["-m", "owner", "!", "--uid-owner", "0", *_tag(net)],
        *["-j", "NFQUEUE", "--queue-num", str(queue_id(net)), "--queue-bypass"],
    ]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def add_queue_rule(net: PodNetwork, run: Runner = _run) -> None:
    rule = queue_rule(net)
    out = _iptables(run, *CHAIN[:2], "-C", CHAIN[2], *rule)
    if out is None:
        raise RuntimeError("network_policies need iptables (the rule that queues packets)")
    if out.returncode == 0:
        return
    out = _iptables(run, *CHAIN[:2], "-I", CHAIN[2], *rule)
    if out is None or out.returncode != 0:
        err = out.stderr.strip() if out is not None else "iptables vanished"
        raise RuntimeError(f"iptables -t mangle -I POSTROUTING {shlex.join(rule)}: {err}")


def has_queue_rule(net: PodNetwork, run: Runner = _run) -> bool:
    out = _iptables(run, *CHAIN[:2], "-C", CHAIN[2], *queue_rule(net))
    return out is not None and out.returncode == 0


def remove_queue_rules(net: PodNetwork, run: Runner = _run) -> list[str]:
    """Deletes every mangle POSTROUTING rule carrying our bridge's netpol comment, whatever
    queue it names (a crashed run's). Returns what it removed."""
    listed = _iptables(run, *CHAIN[:2], "-S", CHAIN[2])
    if listed is None or listed.returncode != 0:
        return []
    tag = f"localkube {net.bridge} netpol"
    removed = []
    for line in listed.stdout.splitlines():
        args = shlex.split(line)
        if args[:1] != ["-A"] or tag not in args:
            continue
        out = _iptables(run, *CHAIN[:2], "-D", *args[1:])
        if out is not None and out.returncode == 0:
            removed.append(f"iptables mangle POSTROUTING NFQUEUE {net.bridge}")
    return removed


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
