"""The pod network of one local cluster: a Linux bridge `lk-<name>` holding the host address
10.<base>.0.1/16; node i hands out pod addresses from 10.<base>.<i+1>.0/24, each pod in its
own network namespace with a veth into the bridge (the process node creates those).

Nothing here routes to the outside: no NAT, and forwarding of packets that arrive on the
bridge is switched off, so pods reach the host and each other, never another network.

The host's firewall, when it has one (iptables), gets rules for the bridge (forward_rules):
with br_netfilter loaded and net.bridge.bridge-nf-call-iptables=1, frames between two ports
of the bridge pass the FORWARD chain, and Docker sets that chain's policy to DROP when it
starts, which would cut pods off from each other. The rules accept traffic between the
bridge's ports and drop what pods would send through the host anywhere else (Docker also
turns net.ipv4.ip_forward, and with it the bridge's forwarding, back on). They go into FORWARD
and, when Docker runs, into DOCKER-USER, and are removed with the bridge.

Leftovers are found by what they are, not by trusting a name alone: veths enslaved to our
bridge, and network namespaces that hold an address inside our /16 or carry our prefix.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BRIDGE_PREFIX = "lk-"
IFNAMSIZ = 15  # Linux interface names are at most 15 characters
# Where the bridge's rules go: FORWARD always; DOCKER-USER where Docker made it (Docker jumps
# there first, and leaves it to the host's administrator).
FORWARD_CHAINS = ("FORWARD", "DOCKER-USER")

log = logging.getLogger("localkube")
Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class PodNetwork:
    name: str
    base: int

    def __post_init__(self) -> None:
        if not 0 < self.base < 256:
            raise ValueError(f"base must be in 1..255, got {self.base}")

    @property
    def bridge(self) -> str:
        return bridge_name(self.name)

    @property
    def host_ip(self) -> str:
        return f"10.{self.base}.0.1"

    @property
    def cidr(self) -> str:
        return f"10.{self.base}.0.0/16"

    @property
    def netns_prefix(self) -> str:
        """Network namespaces the process node creates for this cluster start with this."""
        return f"{self.bridge}-"

    def pod_cidr(self, node_index: int) -> str:
        if not 0 <= node_index < 254:
            raise ValueError(f"node index out of range: {node_index}")
        return f"10.{self.base}.{node_index + 1}.0/24"

    def contains(self, ip: str) -> bool:
        return ipaddress.ip_address(ip) in ipaddress.ip_network(self.cidr)


def bridge_name(cluster_name: str) -> str:
    clean = re.sub(r"[^a-zA-Z0-9-]", "-", cluster_name)
    return (BRIDGE_PREFIX + clean)[:IFNAMSIZ]


def bridge_up_commands(net: PodNetwork) -> list[list[str]]:
    return [
        ["ip", "link", "add", net.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{net.host_ip}/16", "dev", net.bridge],
        ["ip", "link", "set", net.bridge, "up"],
    ]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _ip_json(*args: str) -> list[dict[str, object]]:
    out = _ip("-j", *args, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        return []
    data = json.loads(out.stdout)
    return data if isinstance(data, list) else []


def link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def create_bridge(net: PodNetwork) -> None:
    """Creates the bridge with the host address; an existing one is recreated so that a stale
    bridge from a crashed run cannot keep old addresses or ports."""
    if link_exists(net.bridge):
        destroy_bridge(net)
    others = subnet_users(net)
    if others:
        raise RuntimeError(
            f"{net.cidr} is already used by {', '.join(others)}: pick another base "
            f"(free: {free_base()})"
        )
    for cmd in bridge_up_commands(net):
        subprocess.run(cmd, capture_output=True, text=True, check=True)
    # Packets arriving from pods are never forwarded to another interface.
    fwd = Path(f"/proc/sys/net/ipv4/conf/{net.bridge}/forwarding")
    if fwd.exists():
        fwd.write_text("0\n")
    allow_forwarding(net)


def forward_rules(net: PodNetwork) -> list[list[str]]:
    """The iptables rules (without their chain) for our bridge: accept what goes between two
    of its ports (pod to pod; bridged frames show the bridge as both interfaces), drop what
    would leave through another interface. The two never match the same packet, so their
    order does not matter. The comment names the bridge, for people reading `iptables -S`.

    net.bridge.bridge-nf-call-iptables stays as it is: it is global (a bridge's own
    nf_call_iptables can only add to it), and Docker's and kube-proxy's bridges need it on."""
    tag = ["-m", "comment", "--comment", f"localkube {net.bridge}"]
    return [
        ["-i", net.bridge, "-o", net.bridge, *tag, "-j", "ACCEPT"],
        ["-i", net.bridge, "!", "-o", net.bridge, *tag, "-j", "DROP"],
    ]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _iptables(run: Runner, *args: str) -> subprocess.CompletedProcess[str] | None:
    """iptables, waiting for its lock (other clusters and Docker change rules too); None when
    there is no iptables."""
    try:
        return run(["iptables", "-w", "5", *args])
    except FileNotFoundError:
        return None


def _chain_exists(run: Runner, chain: str) -> bool:
    out = _iptables(run, "-S", chain)
    return out is not None and out.returncode == 0


def allow_forwarding(net: PodNetwork, run: Runner = _run) -> list[str]:
    """Adds forward_rules to each of FORWARD_CHAINS that exists, unless there already.
    Returns the chains that hold them. Without iptables (or one that cannot list FORWARD)
    there is no firewall to pass: nothing to do."""
    if _iptables(run, "--version") is None:
        log.debug("no iptables: no forwarding rules for %s", net.bridge)
        return []
    if not _chain_exists(run, "FORWARD"):
        log.warning("iptables cannot list FORWARD: no forwarding rules for %s", net.bridge)
        return []
    chains = [c for c in FORWARD_CHAINS if c == "FORWARD" or _chain_exists(run, c)]
    for chain in chains:
        for rule in forward_rules(net):
            check = _iptables(run, "-C", chain, *rule)
            if check is not None and check.returncode == 0:
                continue
            out = _iptables(run, "-I", chain, *rule)
            if out is None or out.returncode != 0:
                err = out.stderr.strip() if out is not None else "iptables vanished"
                raise RuntimeError(f"iptables -I {chain} {' '.join(rule)}: {err}")
    return chains


def remove_forwarding(net: PodNetwork, run: Runner = _run) -> list[str]:
    """Deletes every copy of forward_rules from FORWARD_CHAINS. Returns what it removed."""
    if _iptables(run, "--version") is None:
        return []
    removed = []
    for chain in FORWARD_CHAINS:
        for rule in forward_rules(net):
            for _ in range(16):  # a copy per crashed run at most; never loop forever
                out = _iptables(run, "-D", chain, *rule)
                if out is None or out.returncode != 0:
                    break
                removed.append(f"iptables {chain} {rule[-1]} {net.bridge}")
    return removed


def service_dnat_rule(net: PodNetwork, service_ip: str, api_port: int) -> list[str]:
    """The nat PREROUTING rule (without its chain) that stands in for kube-proxy for the one
    Service real nodes' containers are told about: `kubernetes` (service_ip:443) from our
    bridge goes to the apiserver on the host address. Delivered locally, never forwarded."""
    return [
        *["-i", net.bridge, "-d", f"{service_ip}/32", "-p", "tcp", "--dport", "443"],
        *["-m", "comment", "--comment", f"localkube {net.bridge}"],
        *["-j", "DNAT", "--to-destination", f"{net.host_ip}:{api_port}"],
    ]


def add_service_dnat(net: PodNetwork, service_ip: str, api_port: int, run: Runner = _run) -> None:
    rule = service_dnat_rule(net, service_ip, api_port)
    out = _iptables(run, "-t", "nat", "-C", "PREROUTING", *rule)
    if out is None:
        raise RuntimeError("real nodes need iptables (the kubernetes Service's DNAT rule)")
    if out.returncode == 0:
        return
    out = _iptables(run, "-t", "nat", "-I", "PREROUTING", *rule)
    if out is None or out.returncode != 0:
        raise RuntimeError(f"iptables -t nat -I PREROUTING: {out.stderr if out else ''}")


def remove_service_dnat(net: PodNetwork, run: Runner = _run) -> list[str]:
    """Deletes our bridge's nat PREROUTING rules, whatever port they carry (a crashed run's)."""
    listed = _iptables(run, "-t", "nat", "-S", "PREROUTING")
    if listed is None or listed.returncode != 0:
        return []
    removed = []
    for line in listed.stdout.splitlines():
        args = shlex.split(line)
        if args[:1] != ["-A"] or f"localkube {net.bridge}" not in args:
            continue
        out = _iptables(run, "-t", "nat", "-D", *args[1:])
        if out is not None and out.returncode == 0:
            removed.append(f"iptables nat PREROUTING {net.bridge}")
    return removed


def bridge_veths(net: PodNetwork) -> list[str]:
    return [
        str(link["ifname"])
        for link in _ip_json("link", "show", "master", net.bridge)
        if "ifname" in link
    ]


def list_netns() -> list[str]:
    names = []
    for entry in _ip_json("netns", "list"):
        name = entry.get("name")
        if isinstance(name, str):
            names.append(name)
    return names


def netns_addresses(ns: str) -> list[str]:
    addrs = []
    for link in _ip_json("-n", ns, "addr", "show"):
        infos = link.get("addr_info", [])
        if isinstance(infos, list):
            addrs += [str(a["local"]) for a in infos if isinstance(a, dict) and "local" in a]
    return addrs


def our_netns(net: PodNetwork) -> list[str]:
    """Network namespaces that belong to this cluster: named with our prefix, or holding an
    address in our subnet (a crashed node's leftovers, whatever their names)."""
    ours = []
    # While another interface holds our subnet, addresses there are somebody else's pods.
    by_address = not subnet_users(net)
    for ns in list_netns():
        if ns.startswith(net.netns_prefix):
            ours.append(ns)
            continue
        if not by_address:
            continue
        try:
            if any(net.contains(a) for a in netns_addresses(ns)):
                ours.append(ns)
        except ValueError:
            continue
    return ours


def cleanup(net: PodNetwork) -> list[str]:
    """Removes veths on our bridge, our network namespaces and the bridge. Returns what it
    removed, for the log."""
    removed = []
    # Looked up first: a namespace found by its address has none once its veth is gone (a
    # real node's CNI namespaces, named cni-<uuid>).
    namespaces = our_netns(net)
    if link_exists(net.bridge):
        for veth in bridge_veths(net):
            if _ip("link", "delete", veth, check=False).returncode == 0:
                removed.append(f"link {veth}")
    for ns in namespaces:
        if _ip("netns", "delete", ns, check=False).returncode == 0:
            removed.append(f"netns {ns}")
    if destroy_bridge(net):
        removed.append(f"link {net.bridge}")
    removed += remove_forwarding(net)
    removed += remove_service_dnat(net)
    return removed


def destroy_bridge(net: PodNetwork) -> bool:
    if not link_exists(net.bridge):
        return False
    _ip("link", "delete", net.bridge, "type", "bridge", check=False)
    return True


def subnet_users(net: PodNetwork) -> list[str]:
    """Host interfaces other than our bridge with an address inside our /16."""
    users = []
    for link in _ip_json("addr", "show"):
        infos = link.get("addr_info", [])
        name = str(link.get("ifname", "?"))
        if name == net.bridge or not isinstance(infos, list):
            continue
        for a in infos:
            if isinstance(a, dict) and a.get("family") == "inet" and net.contains(str(a["local"])):
                users.append(name)
    return users


def used_bases() -> set[int]:
    """Second octets of 10.x.0.0/16 networks already on a host interface."""
    used = set()
    for link in _ip_json("addr", "show"):
        infos = link.get("addr_info", [])
        if not isinstance(infos, list):
            continue
        for a in infos:
            if not isinstance(a, dict):
                continue
            m = re.fullmatch(r"10\.(\d+)\.\d+\.\d+", str(a.get("local", "")))
            if m:
                used.add(int(m.group(1)))
    return used


def free_base(candidates: range = range(200, 255)) -> int:
    """A base whose 10.<base>.0.0/16 no host interface uses, so that parallel local clusters
    (other test sessions on the same host) do not share a subnet."""
    used = used_bases()
    for b in candidates:
        if b not in used:
            return b
    raise RuntimeError(f"no free 10.x.0.0/16 among {candidates}")
