"""Pod network naming and addressing (the pure parts of network.py)."""

from __future__ import annotations

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
