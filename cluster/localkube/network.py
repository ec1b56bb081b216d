"""The pod network of one local cluster: a Linux bridge `lk-<name>` holding the host address
10.<base>.0.1/16; node i hands out pod addresses from 10.<base>.<i+1>.0/24, each pod in its
own network namespace with a veth into the bridge (the process node creates those).

Nothing here routes to the outside: no NAT, and forwarding of packets that arrive on the
bridge is switched off, so pods reach the host and each other, never another network.

Leftovers are found by what they are, not by trusting a name alone: veths enslaved to our
bridge, and network namespaces that hold an address inside our /16 or carry our prefix.
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

BRIDGE_PREFIX = "lk-"
IFNAMSIZ = 15  # Linux interface names are at most 15 characters


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
    if link_exists(net.bridge):
        for veth in bridge_veths(net):
            if _ip("link", "delete", veth, check=False).returncode == 0:
                removed.append(f"link {veth}")
    for ns in our_netns(net):
        if _ip("netns", "delete", ns, check=False).returncode == 0:
            removed.append(f"netns {ns}")
    if destroy_bridge(net):
        removed.append(f"link {net.bridge}")
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
