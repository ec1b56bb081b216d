"""The NetworkPolicy enforcer's pure parts (localkube.netpol): names, queue numbers, its
command line, and what is read back from the kernel and from `nft`."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from localkube import netpol
from localkube.network import PodNetwork

NET = PodNetwork("it123", 201)


def test_each_node_of_each_cluster_gets_its_own_table_and_queue() -> None:
    other = PodNetwork("it456", 202)
    tables = {netpol.table_name(n, node) for n in (NET, other) for node in ("node-0", "node-1")}
    queues = {netpol.queue_id(n, i) for n in (NET, other) for i in (0, 1)}
    assert len(tables) == len(queues) == 4
    assert netpol.table_name(NET, "node-0") == "localkube-lk-it123-node-0"


@pytest.mark.parametrize("base", [1, 255])
def test_queue_numbers_fit_sixteen_bits(base: int) -> None:
    net = PodNetwork("x", base)
    assert 0 <= netpol.queue_id(net, 0) < netpol.queue_id(net, 253) < 2**16


def test_queue_number_refuses_a_node_index_that_would_reach_the_next_base() -> None:
    with pytest.raises(ValueError):
        netpol.queue_id(NET, 256)


def test_enforcer_args_name_the_node_table_queue_and_kubeconfig() -> None:
    argv = netpol.enforcer_args(
        Path("/b/kube-network-policies-v0.8.0"), Path("/d/kc"), NET, "node-1", 1
    )
    assert argv[0] == "/b/kube-network-policies-v0.8.0"
    assert "--kubeconfig=/d/kc" in argv
    assert "--hostname-override=node-1" in argv
    assert f"--nfqueue-id={201 * 256 + 1}" in argv
    assert "--nftables-table=localkube-lk-it123-node-1" in argv


def test_binary_name_carries_the_version() -> None:
    assert netpol.binary(Path("/b"), "v0.8.0") == Path("/b/kube-network-policies-v0.8.0")


def test_bound_queues_reads_the_kernels_list() -> None:
    text = (
        "51457  12345     0 2   128     0     0        7  1\n"
        "  100  999     3 2   128     0     0       42  1\n"
    )
    assert netpol.bound_queues(text) == {51457, 100}
    assert netpol.bound_queues("") == set()


def test_queue_bound_is_false_without_the_proc_file(tmp_path: Path) -> None:
    assert not netpol.queue_bound(1, tmp_path / "missing")
    f = tmp_path / "nfnetlink_queue"
    f.write_text("7 1 0 2 128 0 0 0 1\n")
    assert netpol.queue_bound(7, f) and not netpol.queue_bound(8, f)


LIST_TABLES = {
    "nftables": [
        {"metainfo": {"version": "1.0.6"}},
        {"table": {"family": "ip", "name": "filter", "handle": 1}},
        {"table": {"family": "inet", "name": "localkube-lk-it123-node-0", "handle": 7}},
        {"table": {"family": "inet", "name": "localkube-lk-it1234-node-0", "handle": 8}},
        {"table": {"family": "inet", "name": "kube-network-policies", "handle": 9}},
    ]
}


def test_only_this_clusters_tables_are_its_own() -> None:
    names = netpol.parse_tables(json.dumps(LIST_TABLES))
    assert names == [
        "localkube-lk-it123-node-0",
        "localkube-lk-it1234-node-0",
        "kube-network-policies",
    ]
    # lk-it1234 is another cluster's bridge, though its name starts with ours.
    assert netpol.cluster_tables(names, NET) == ["localkube-lk-it123-node-0"]
    assert netpol.parse_tables("not json") == []


def test_set_elements_are_the_addresses_listed() -> None:
    listed = {
        "nftables": [
            {"metainfo": {}},
            {"set": {"family": "inet", "name": "podips-v4", "elem": ["10.201.1.3", "10.201.1.4"]}},
        ]
    }
    assert netpol.parse_set_elements(json.dumps(listed)) == {"10.201.1.3", "10.201.1.4"}
    empty = {"nftables": [{"set": {"family": "inet", "name": "podips-v4"}}]}
    assert netpol.parse_set_elements(json.dumps(empty)) == set()


def test_remove_tables_deletes_this_clusters_tables_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _: "/usr/sbin/nft")
    calls: list[list[str]] = []

    def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        out = json.dumps(LIST_TABLES) if cmd[-1] == "tables" else ""
        return subprocess.CompletedProcess(cmd, 0, out, "")

    assert netpol.remove_tables(NET, run) == ["nft table inet localkube-lk-it123-node-0"]
    assert calls[-1] == ["nft", "delete", "table", "inet", "localkube-lk-it123-node-0"]


def test_an_enforcer_is_ready_only_once_its_table_is_listed() -> None:
    def run(answer: int) -> netpol.Runner:
        return lambda cmd: subprocess.CompletedProcess(cmd, answer, "", "")

    assert netpol.table_exists(NET, "node-0", run(0))
    assert not netpol.table_exists(NET, "node-0", run(1))
