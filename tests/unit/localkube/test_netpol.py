"""The NetworkPolicy enforcer's pure parts (localkube.netpol): names, queue numbers, its
command line, the iptables rule that feeds it and its removal, and the kernel's list of bound
queues."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from localkube import netpol
from localkube.network import PodNetwork

NET = PodNetwork("it123", 201)


def test_each_cluster_gets_its_own_table_and_queue() -> None:
    nets = [PodNetwork("it123", 201), PodNetwork("it456", 202), PodNetwork("it1234", 203)]
    assert len({netpol.table_name(n) for n in nets}) == len({netpol.queue_id(n) for n in nets}) == 3
    assert netpol.table_name(NET) == "localkube-lk-it123"


@pytest.mark.parametrize("base", [1, 255])
def test_queue_numbers_fit_sixteen_bits(base: int) -> None:
    assert 0 < netpol.queue_id(PodNetwork("x", base)) < 2**16


def test_enforcer_args_name_no_node_the_table_queue_and_kubeconfig() -> None:
    argv = netpol.enforcer_args(Path("/b/kube-network-policies-v0.8.0"), Path("/d/kc"), NET)
    assert argv[0] == "/b/kube-network-policies-v0.8.0"
    assert "--kubeconfig=/d/kc" in argv
    assert f"--nfqueue-id={201 * 256}" in argv
    assert "--nftables-table=localkube-lk-it123" in argv
    # Upstream's nftables set holds the pods of its node: none, so it queues nothing.
    assert f"--hostname-override={netpol.NO_NODE}" in argv


def test_no_node_name_is_a_valid_node_name() -> None:
    # A Node's name is a DNS subdomain: lower-case letters, digits, '-' and '.'.
    assert not set(netpol.NO_NODE) <= set("abcdefghijklmnopqrstuvwxyz0123456789-.")


def test_the_rule_queues_new_connections_out_of_the_bridge_but_roots_and_bypasses() -> None:
    rule = netpol.queue_rule(NET)
    text = " ".join(rule)
    assert "-o lk-it123 " in text
    assert "--ctstate NEW" in text
    assert "-m owner ! --uid-owner 0" in text
    assert rule[-4:] == ["NFQUEUE", "--queue-num", str(201 * 256), "--queue-bypass"]


def test_binary_name_carries_the_version() -> None:
    assert netpol.binary(Path("/b"), "v0.8.0") == Path("/b/kube-network-policies-v0.8.0")


class FakeMangle:
    """iptables -t mangle ... POSTROUTING over an in-memory chain; -S prints rules the way
    iptables does (the comment double-quoted)."""

    def __init__(self, *rules: list[str]) -> None:
        self.rules = [list(r) for r in rules]

    def __call__(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        assert cmd[:5] == ["iptables", "-w", "5", "-t", "mangle"], cmd
        op, chain, *rule = cmd[5:]
        assert chain == "POSTROUTING", cmd
        ok = True
        out = ""
        if op == "-C":
            ok = rule in self.rules
        elif op == "-I":
            self.rules.insert(0, rule)
        elif op == "-D":
            ok = rule in self.rules
            if ok:
                self.rules.remove(rule)
        elif op == "-S":
            out = "-P POSTROUTING ACCEPT\n" + "".join(
                "-A POSTROUTING " + " ".join(f'"{a}"' if " " in a else a for a in r) + "\n"
                for r in self.rules
            )
        else:
            raise AssertionError(cmd)
        return subprocess.CompletedProcess(cmd, 0 if ok else 1, out, "" if ok else "no rule")


def test_the_rule_is_added_once() -> None:
    fake = FakeMangle()
    netpol.add_queue_rule(NET, fake)
    netpol.add_queue_rule(NET, fake)
    assert fake.rules == [netpol.queue_rule(NET)]
    assert netpol.has_queue_rule(NET, fake)


def test_removal_takes_every_copy_of_this_clusters_rule_and_no_other() -> None:
    other = PodNetwork("it1234", 202)  # its bridge's name starts with ours
    stale = [*netpol.queue_rule(NET)[:-3], "--queue-num", "7"]  # a crashed run's, other queue
    docker = ["-o", "docker0", "-j", "ACCEPT"]
    fake = FakeMangle(netpol.queue_rule(NET), stale, netpol.queue_rule(other), docker)
    assert len(netpol.remove_queue_rules(NET, fake)) == 2
    assert fake.rules == [netpol.queue_rule(other), docker]
    assert not netpol.has_queue_rule(NET, fake)


def test_without_iptables_the_rule_cannot_be_added_and_nothing_is_removed() -> None:
    def missing(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(cmd[0])

    with pytest.raises(RuntimeError, match="need iptables"):
        netpol.add_queue_rule(NET, missing)
    assert netpol.remove_queue_rules(NET, missing) == []


def test_bound_queues_reads_the_kernels_list() -> None:
    text = (
        "51456  12345     0 2   128     0     0        7  1\n"
        "  100  999     3 2   128     0     0       42  1\n"
    )
    assert netpol.bound_queues(text) == {51456, 100}
    assert netpol.bound_queues("") == set()


def test_queue_bound_is_false_without_the_proc_file(tmp_path: Path) -> None:
    assert not netpol.queue_bound(1, tmp_path / "missing")
    f = tmp_path / "nfnetlink_queue"
    f.write_text("7 1 0 2 128 0 0 0 1\n")
    assert netpol.queue_bound(7, f) and not netpol.queue_bound(8, f)
