"""Pod network naming and addressing (the pure parts of network.py)."""

from __future__ import annotations

import subprocess

import pytest
from localkube import network
from localkube.network import PodNetwork


def test_addresses_follow_the_base() -> None:
    net = PodNetwork("local", 244)
    assert net.bridge == "lk-local"
    assert net.host_ip == "10.244.0.1"
    assert net.cidr == "10.244.0.0/16"
    assert net.pod_cidr(0) == "10.244.1.0/24"
    assert net.pod_cidr(1) == "10.244.2.0/24"
    assert net.netns_prefix == "lk-local-"


def test_bridge_name_fits_ifnamsiz_and_is_sanitised() -> None:
    name = network.bridge_name("a-very-long-cluster_name.x")
    assert len(name) <= 15
    assert name.startswith("lk-")
    assert all(c.isalnum() or c == "-" for c in name)


@pytest.mark.parametrize(("ip", "inside"), [("10.244.3.7", True), ("10.245.0.1", False)])
def test_contains(ip: str, inside: bool) -> None:
    assert PodNetwork("x", 244).contains(ip) is inside


@pytest.mark.parametrize("base", [0, 256, -1])
def test_base_out_of_range(base: int) -> None:
    with pytest.raises(ValueError):
        PodNetwork("x", base)


def test_pod_cidr_index_out_of_range() -> None:
    with pytest.raises(ValueError):
        PodNetwork("x", 244).pod_cidr(254)


def test_bridge_commands_set_host_address_and_enable_no_nat() -> None:
    cmds = network.bridge_up_commands(PodNetwork("t", 210))
    assert cmds[0] == ["ip", "link", "add", "lk-t", "type", "bridge"]
    assert ["ip", "addr", "add", "10.210.0.1/16", "dev", "lk-t"] in cmds
    flat = " ".join(" ".join(c) for c in cmds)
    assert "nat" not in flat.lower()
    assert "masquerade" not in flat.lower()


class FakeIptables:
    """iptables as allow_forwarding and remove_forwarding use it, over in-memory chains."""

    def __init__(self, *chains: str, present: bool = True) -> None:
        self.chains: dict[str, list[list[str]]] = {c: [] for c in chains}
        self.present = present
        self.fail_insert = False

    def __call__(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        if not self.present:
            raise FileNotFoundError(cmd[0])
        assert cmd[:3] == ["iptables", "-w", "5"], cmd
        op, *rest = cmd[3:]

        def result(ok: bool, err: str = "") -> subprocess.CompletedProcess[str]:
            return subprocess.CompletedProcess(cmd, 0 if ok else 1, "", err)

        if op == "--version":
            return result(True)
        chain, rule = rest[0], rest[1:]
        rules = self.chains.get(chain)
        if rules is None:
            return result(False, f"iptables: No chain/target/match by that name ({chain}).")
        if op == "-S":
            return result(True)
        if op == "-C":
            return result(rule in rules, "Bad rule (does a matching rule exist in that chain?).")
        if op == "-I":
            if self.fail_insert:
                return result(False, "Permission denied (you must be root)")
            rules.insert(0, rule)
            return result(True)
        if op == "-D":
            if rule not in rules:
                return result(False, "Bad rule")
            rules.remove(rule)
            return result(True)
        raise AssertionError(f"unexpected {cmd}")


NET = PodNetwork("t", 210)
DOCKER_RETURN = ["-j", "RETURN"]


def test_forward_rules_accept_between_bridge_ports_and_drop_the_rest() -> None:
    accept, drop = network.forward_rules(NET)
    assert accept[:4] == ["-i", "lk-t", "-o", "lk-t"] and accept[-2:] == ["-j", "ACCEPT"]
    assert drop[:5] == ["-i", "lk-t", "!", "-o", "lk-t"] and drop[-2:] == ["-j", "DROP"]
    for rule in (accept, drop):
        assert rule[rule.index("--comment") + 1] == "localkube lk-t"
    flat = " ".join(accept + drop).lower()
    assert "nat" not in flat and "masquerade" not in flat


def test_allow_forwarding_adds_rules_to_forward_once() -> None:
    ipt = FakeIptables("FORWARD")
    assert network.allow_forwarding(NET, run=ipt) == ["FORWARD"]
    assert sorted(ipt.chains["FORWARD"]) == sorted(network.forward_rules(NET))
    # Idempotent: a second bridge creation (or a restarted cluster) adds no copies.
    network.allow_forwarding(NET, run=ipt)
    assert len(ipt.chains["FORWARD"]) == 2


def test_allow_forwarding_also_fills_docker_user_ahead_of_its_return() -> None:
    ipt = FakeIptables("FORWARD", "DOCKER-USER")
    ipt.chains["DOCKER-USER"].append(DOCKER_RETURN)
    assert network.allow_forwarding(NET, run=ipt) == ["FORWARD", "DOCKER-USER"]
    docker_user = ipt.chains["DOCKER-USER"]
    assert docker_user[-1] == DOCKER_RETURN
    assert sorted(docker_user[:-1]) == sorted(network.forward_rules(NET))


def test_remove_forwarding_removes_every_copy_and_nothing_else() -> None:
    ipt = FakeIptables("FORWARD", "DOCKER-USER")
    other = PodNetwork("other", 211)
    network.allow_forwarding(other, run=ipt)
    network.allow_forwarding(NET, run=ipt)
    # A crashed run's copy, added before the check existed.
    ipt.chains["FORWARD"].append(network.forward_rules(NET)[0])
    ipt.chains["DOCKER-USER"].append(DOCKER_RETURN)
    removed = network.remove_forwarding(NET, run=ipt)
    assert len(removed) == 5 and all("lk-t" in r for r in removed)
    assert sorted(ipt.chains["FORWARD"]) == sorted(network.forward_rules(other))
    assert ipt.chains["DOCKER-USER"][-1] == DOCKER_RETURN
    assert network.remove_forwarding(NET, run=ipt) == []


def test_without_iptables_nothing_happens() -> None:
    ipt = FakeIptables("FORWARD", present=False)
    assert network.allow_forwarding(NET, run=ipt) == []
    assert network.remove_forwarding(NET, run=ipt) == []


def test_a_rule_that_cannot_be_added_fails_loudly() -> None:
    ipt = FakeIptables("FORWARD")
    ipt.fail_insert = True
    with pytest.raises(RuntimeError, match="iptables -I FORWARD .*Permission denied"):
        network.allow_forwarding(NET, run=ipt)
