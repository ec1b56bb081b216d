"""Host-network jobs (render/ports.py, docs/runtimes.md): each gets a rendezvous and a status port
of its own, so that two of them on the same nodes do not collide; its pods resolve cluster DNS
(ClusterFirstWithHostNet); its Service, NetworkPolicy and the operator's reads follow the
ports. A job on the pod network keeps the contract's ports."""

from __future__ import annotations

from typing import Any

import jobs
from torchrun_operator.kube.readschedule import targets_of
from torchrun_operator.launcher import contract
from torchrun_operator.render import OperatorPeer, render_network_policy, render_pod
from torchrun_operator.render.ports import HOST_PORT_BASE, HOST_PORT_PAIRS, ports
from torchrun_operator.render.service import render_service

Obj = dict[str, Any]


def host_job(uid: str, **spec: Any) -> Obj:
    return jobs.job(
        "train", pod={"hostNetwork": True}, metadata={"namespace": "ml", "uid": uid}, **spec
    )


def trainer(pod: Obj) -> Obj:
    c: Obj = pod["spec"]["containers"][0]
    return c


def test_a_pod_network_job_keeps_the_contracts_ports() -> None:
    job = jobs.job("train", metadata={"namespace": "ml", "uid": "u"})
    assert ports(job) == (29400, contract.STATUS_PORT)
    pod = render_pod(job, 0, 0)
    assert "dnsPolicy" not in pod["spec"]


def test_host_network_jobs_get_distinct_port_pairs_in_range() -> None:
    pairs = {ports(host_job(f"uid-{i}")) for i in range(50)}
    assert len(pairs) == 50
    for rdzv, status in pairs:
        assert HOST_PORT_BASE <= rdzv < status < HOST_PORT_BASE + 2 * HOST_PORT_PAIRS
        assert status == rdzv + 1 and rdzv % 2 == 0
    assert ports(host_job("uid-1")) == ports(host_job("uid-1"))  # every attempt alike


def test_a_host_network_pod_uses_its_jobs_ports_and_cluster_dns() -> None:
    job = host_job("uid-a")
    rdzv, status = ports(job)
    for attempt in (0, 3):
        pod = render_pod(job, 1, attempt)
        t = trainer(pod)
        args = t["args"]
        host = "train-0" if attempt == 0 else f"train-0-a{attempt}"
        assert args[args.index("--rdzv-endpoint") + 1] == f"{host}.train:{rdzv}"
        assert {p["containerPort"] for p in t["ports"]} == {rdzv, status}
        env = {e["name"]: e.get("value") for e in t["env"]}
        assert env[contract.ENV_STATUS_PORT] == str(status)
        assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert pod["spec"]["hostNetwork"] is True
    svc = render_service(job)
    assert svc["spec"]["ports"][0]["port"] == rdzv
    policy = render_network_policy(job, OperatorPeer("torchrun-system"))
    assert policy["spec"]["ingress"][1]["ports"] == [{"port": status, "protocol": "TCP"}]


def test_a_templates_dns_policy_and_an_explicit_rendezvous_port_are_kept() -> None:
    job = host_job("uid-b", rendezvous={"port": 23456})
    job["spec"]["template"]["spec"]["dnsPolicy"] = "Default"
    rdzv, status = ports(job)
    assert rdzv == 23456 and status != 23456
    assert render_pod(job, 0, 0)["spec"]["dnsPolicy"] == "Default"


def test_the_operator_reads_each_pod_on_its_jobs_status_port() -> None:
    pod = {
        "metadata": {"name": "p", "uid": "u", "labels": {"torchrun.dev/attempt": "0"}},
        "status": {"phase": "Running", "podIP": "10.0.0.9"},
    }
    assert [t.port for t in targets_of([pod], 0, 20123)] == [20123]
    assert [t.port for t in targets_of([pod], 0)] == [contract.STATUS_PORT]
