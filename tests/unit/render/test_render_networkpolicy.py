"""The per-job NetworkPolicy: what it selects, what it admits, and when it is rendered."""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from kubernetes import client
from torchrun_operator.api import names
from torchrun_operator.render import (
    children,
    render_network_policy,
    render_pod,
    render_service,
    wants_network_policy,
)

Obj = dict[str, Any]


def make_job(name: str = "train", namespace: str = "ml", **spec: Any) -> Obj:
    return jobs.job(
        name,
        **{"nodes": 3, **spec},
        image="i",
        command=["python", "x.py"],
        trainer={"name": "t"},
        metadata={"namespace": namespace, "uid": "u-1"},
    )


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A LabelSelector's meaning, for the matchLabels-only selectors the renderer writes."""
    assert set(selector) <= {"matchLabels"}, selector
    return selector.get("matchLabels", {}).items() <= labels.items()


def admits(
    policy: Obj, *, src_ns: str, src_labels: dict[str, str], port: int, protocol: str = "TCP"
) -> bool:
    """Whether `policy` admits a connection to a pod it selects, from a pod with these labels
    in `src_ns`: the NetworkPolicy semantics for the peer kinds and ports the renderer may
    write (podSelector without namespaceSelector = the policy's own namespace)."""
    assert "Ingress" in policy["spec"]["policyTypes"]
    for rule in policy["spec"].get("ingress") or []:
        peers = rule.get("from")
        peer_ok = not peers or any(
            set(peer) == {"podSelector"}
            and src_ns == policy["metadata"]["namespace"]
            and selects(peer["podSelector"], src_labels)
            for peer in peers
        )
        ports = rule.get("ports")
        port_ok = not ports or any(
            p.get("protocol", "TCP") == protocol
            and ("port" not in p or p["port"] <= port <= p.get("endPort", p["port"]))
            for p in ports
        )
        if peer_ok and port_ok:
            return True
    return False


def test_policy_is_named_and_owned_like_the_service() -> None:
    job = make_job()
    policy = render_network_policy(job)
    service = render_service(job)
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["name"] == "train"
    assert policy["metadata"]["namespace"] == "ml"
    # Same child_metadata as the Service: same label, same controller owner reference.
    assert policy["metadata"] == service["metadata"]
    (owner,) = policy["metadata"]["ownerReferences"]
    assert owner["uid"] == "u-1" and owner["controller"] and owner["blockOwnerDeletion"]


def test_policy_is_a_valid_network_policy_with_no_unknown_fields() -> None:
    # The client's model drops any key it does not know: a round trip that changes nothing
    # means every field is spelled as the API spells it.
    policy = render_network_policy(make_job())
    api = client.ApiClient()
    model = api._ApiClient__deserialize(policy, "V1NetworkPolicy")  # type: ignore[attr-defined]
    assert api.sanitize_for_serialization(model) == policy


def test_policy_selects_every_pod_of_the_job_and_only_them() -> None:
    job = make_job()
    policy = render_network_policy(job)
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress is left alone
    assert "egress" not in policy["spec"]
    selector = policy["spec"]["podSelector"]
    for pod in (render_pod(job, 0, 0), render_pod(job, 2, 5), render_pod(job, 1, 1, 3)):
        assert selects(selector, pod["metadata"]["labels"])
    other = render_pod(make_job("train-2"), 0, 0)
    assert not selects(selector, other["metadata"]["labels"])


@pytest.mark.parametrize("rdzv_port", [29400, 1234])
def test_job_pods_reach_each_other_on_every_port(rdzv_port: int) -> None:
    job = make_job(rendezvous={"port": rdzv_port})
    policy = render_network_policy(job)
    peer = render_pod(job, 1, 0)["metadata"]["labels"]
    # The rendezvous store, and the collectives' ephemeral ports (gloo, NCCL sockets, the
    # per-round TCPStore): a policy admitting only the rendezvous port would hang every job.
    for port, protocol in [(rdzv_port, "TCP"), (41837, "TCP"), (60001, "TCP"), (5353, "UDP")]:
        assert admits(policy, src_ns="ml", src_labels=peer, port=port, protocol=protocol)


@pytest.mark.parametrize(
    ("src_ns", "src_labels"),
    [
        ("ml", {}),  # any other pod of the namespace
        ("ml", {names.LABEL_JOB_NAME: "other-job"}),  # another job's pods
        ("ml", {"app": "train"}),
        ("elsewhere", {names.LABEL_JOB_NAME: "train"}),  # same label, another namespace
    ],
)
def test_nothing_else_reaches_the_rendezvous_port(src_ns: str, src_labels: dict[str, str]) -> None:
    job = make_job()
    policy = render_network_policy(job)
    for port in (29400, 41837):
        assert not admits(policy, src_ns=src_ns, src_labels=src_labels, port=port)


@pytest.mark.parametrize(
    ("enabled", "default", "wanted"),
    [
        (None, True, True),
        (None, False, False),
        (True, False, True),
        (True, True, True),
        (False, True, False),
        (False, False, False),
    ],
)
def test_the_job_overrides_the_operator_default(
    enabled: bool | None, default: bool, wanted: bool
) -> None:
    spec: dict[str, Any] = {} if enabled is None else {"networkPolicy": {"enabled": enabled}}
    job = make_job(**spec)
    assert wants_network_policy(job, default) is wanted
    kinds = [o["kind"] for o in children(job, b"src", network_policy_default=default)]
    expected = ["Service", "ConfigMap"] + (["NetworkPolicy"] if wanted else [])
    assert kinds == expected


def test_children_render_the_policy_by_default() -> None:
    *_, policy = children(make_job(), b"src")
    assert policy == render_network_policy(make_job())
