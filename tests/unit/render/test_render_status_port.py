"""The launcher's status port: in the pod contract (containerPort, environment) and admitted by
the job's NetworkPolicy from the operator's pods, and from nothing else."""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from kubernetes import client
from torchrun_operator.api import names
from torchrun_operator.render import OperatorPeer, children, render_network_policy, render_pod

Obj = dict[str, Any]


def make_job(**spec: Any) -> Obj:
    return jobs.job(
        "train",
        **{"nodes": 3, **spec},
        image="i",
        command=["python", "x.py"],
        trainer={"name": "t"},
        metadata={"namespace": "ml", "uid": "u-1"},
    )


def env(pod: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_the_trainer_declares_the_status_port_and_knows_it() -> None:
    pod = render_pod(make_job(), 2, 0)
    ports = pod["spec"]["containers"][0]["ports"]
    assert {"name": "torchrun-status", "containerPort": 29401, "protocol": "TCP"} in ports
    e = env(pod)
    assert e["TORCHRUN_OPERATOR_STATUS_PORT"] == "29401"
    assert e["TORCHRUN_OPERATOR_INDEX"] == "2"
    assert e["TORCHRUN_OPERATOR_NODE_RANK"] == "2"  # the index's deprecated name
    assert e["TORCHRUN_OPERATOR_PROGRESS_WINDOW"] == "60"
    assert pod["metadata"]["labels"][names.LABEL_INDEX] == "2"


def test_the_straggler_window_reaches_the_launcher() -> None:
    job = make_job(monitoring={"straggler": {"windowSeconds": 20}})
    assert env(render_pod(job, 0, 0))["TORCHRUN_OPERATOR_PROGRESS_WINDOW"] == "20"


def test_a_template_that_declares_the_port_keeps_its_declaration() -> None:
    job = make_job()
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    trainer["ports"] = [{"name": "mine", "containerPort": 29401}]
    ports = render_pod(job, 0, 0)["spec"]["containers"][0]["ports"]
    assert [p["containerPort"] for p in ports].count(29401) == 1


PEER = OperatorPeer("torchrun-system")
OPERATOR = {"app.kubernetes.io/name": "torchrun-operator", "app.kubernetes.io/instance": "x"}


def admitted(policy: Obj, src_ns: str, labels: dict[str, str], port: int) -> bool:
    """NetworkPolicy semantics for the two peer forms the renderer writes: a podSelector
    alone (the policy's namespace), and a namespaceSelector by name with a podSelector."""
    for rule in policy["spec"]["ingress"]:
        ports = rule.get("ports")
        if ports and not any(p["port"] == port and p["protocol"] == "TCP" for p in ports):
            continue
        for peer in rule["from"]:
            pods = peer["podSelector"]["matchLabels"]
            if "namespaceSelector" in peer:
                ns = peer["namespaceSelector"]["matchLabels"]
                ns_ok = ns == {"kubernetes.io/metadata.name": src_ns}
            else:
                ns_ok = src_ns == policy["metadata"]["namespace"]
            if ns_ok and pods.items() <= labels.items():
                return True
    return False


def test_the_operators_pods_reach_the_status_port_and_nothing_else() -> None:
    job = make_job()
    policy = render_network_policy(job, PEER)
    assert admitted(policy, "torchrun-system", OPERATOR, 29401)
    for port in (29400, 41837):
        assert not admitted(policy, "torchrun-system", OPERATOR, port)
    # Not another namespace's pods with the operator's label, nor other pods of its namespace.
    assert not admitted(policy, "elsewhere", OPERATOR, 29401)
    assert not admitted(policy, "torchrun-system", {"app": "x"}, 29401)
    # The job's own pods still reach each other on every port.
    peer = render_pod(job, 1, 0)["metadata"]["labels"]
    for port in (29400, 29401, 41837):
        assert admitted(policy, "ml", peer, port)


def test_the_operator_rule_is_a_valid_network_policy() -> None:
    policy = render_network_policy(make_job(), PEER)
    api = client.ApiClient()
    model = api._ApiClient__deserialize(policy, "V1NetworkPolicy")  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(model) == policy


@pytest.mark.parametrize("peer", [None, PEER])
def test_without_a_known_operator_namespace_there_is_no_such_rule(
    peer: OperatorPeer | None,
) -> None:
    *_, policy = children(make_job(), b"src", True, peer)
    rules = policy["spec"]["ingress"]
    assert len(rules) == (1 if peer is None else 2)
