"""Node-aware recovery on a real cluster: a node stops answering, its pod is evicted (the
not-ready/unreachable taint), and the job's next attempt keeps off that node.

The node is lost as tests/integration/nodes.py loses one: a process node's heartbeats paused,
or a kind node's container frozen. The node controller marks it NotReady, taints it, and the
taint evicts its pod. The operator records the node in status.avoidedNodes with the gang
restart, the next attempt's pods carry a required node affinity keeping them off it, an event
names the node, and `kubectl dtj status` lists it.
"""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from dtj import IMAGE, SMALL, apply, dtj_status, get_job, job_pods, wait_for
from kubernetes import client
from nodes import FAST_EVICTION, node_lost, spread, why_together, workers_usable

# The node is lost by pausing a process node's heartbeats or freezing a kind node's container.
pytestmark = [pytest.mark.host_nodes, pytest.mark.usefixtures("operator")]


def kept_off(pod: Any) -> list[str]:
    affinity = pod.spec.affinity
    required = (
        affinity
        and affinity.node_affinity
        and affinity.node_affinity.required_during_scheduling_ignored_during_execution
    )
    out: list[str] = []
    for term in required.node_selector_terms if required else []:
        for f in term.match_fields or []:
            if f.key == "metadata.name" and f.operator == "NotIn":
                out += f.values
    return out


def sleeping_job(name: str) -> dict[str, Any]:
    """Two pods, one per node, that sleep; evicted 2 s after their node's taint."""
    return jobs.job(
        name,
        nodes=2,
        nproc=1,
        image=IMAGE,
        command=["python", "-c", "import time; time.sleep(900)"],
        trainer={"resources": SMALL},
        pod={
            "terminationGracePeriodSeconds": 2,
            "tolerations": FAST_EVICTION,
            "affinity": spread(name),
        },
        rendezvous={"joinTimeoutSeconds": 90},
        failurePolicy={"maxRestarts": 2, "backoffSeconds": 1},
    )


def placed(kube: client.ApiClient, namespace: str, name: str) -> dict[str, str] | None:
    """Each Running pod's node by pod index, once both run."""
    pods = [p for p in job_pods(kube, namespace, name) if p.status.phase == "Running"]
    by_index = {p.metadata.labels["torchrun.dev/index"]: p.spec.node_name for p in pods}
    return by_index if len(by_index) == 2 else None


def test_the_attempt_after_a_lost_node_keeps_off_it(
    cluster: Any, kube: client.ApiClient, namespace: str
) -> None:
    name = "lost-node-avoided"
    workers_usable(kube)
    apply(kube, namespace, [sleeping_job(name)])
    core = client.CoreV1Api(kube)
    nodes = wait_for("both pods running", lambda: placed(kube, namespace, name), 120, interval=1)
    node, other = nodes["1"], nodes["0"]
    assert node != other, "both pods on one node: losing it would not be losing one pod\n" + (
        why_together(kube, namespace, name)
    )
    with node_lost(cluster, kube, node, ready_timeout=90):

        def restarted() -> tuple[dict[str, Any], list[Any]] | None:
            job = get_job(kube, namespace, name)
            status = job.get("status") or {}
            pods = [
                p
                for p in job_pods(kube, namespace, name)
                if p.metadata.labels.get("torchrun.dev/attempt") == "1" and p.spec.node_name
            ]
            if status.get("attempt") != 1 or len(pods) != 2:
                return None
            return status, pods

        status, pods = wait_for("attempt 1 scheduled", restarted, timeout=180, interval=1)
        [avoided] = status["avoidedNodes"]
        assert avoided["node"] == node, status
        assert avoided["reason"] in ("DeletionByTaintManager", "NodeLost"), avoided
        assert status["failure"]["node"] == node and status["failure"]["index"] == 1
        for pod in pods:
            # Required, so the scheduler never places it there; and it did not.
            assert kept_off(pod) == [node], pod.spec.affinity
            assert pod.spec.node_name == other
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        said = [e.message or "" for e in events.items if e.reason == "AvoidingNode"]
        assert said and f"node {node}:" in said[0] and "keep off it until" in said[0], said
        text = dtj_status(cluster, namespace, name)
        assert "Avoided nodes (the job's pods keep off them):" in text, text
        row = next(line for line in text.splitlines() if line.startswith(node + " "))
        assert avoided["reason"] in row, text


def test_a_pod_left_terminating_on_a_dead_node_is_deleted_by_force(
    cluster: Any, kube: client.ApiClient, namespace: str
) -> None:
    # The node's kubelet is gone: the evicted pod stays Terminating, and the next attempt,
    # whose pod of that index has the same hostname, would wait for it for ever.
    name = "dead-node"
    workers_usable(kube)
    apply(kube, namespace, [sleeping_job(name)])
    nodes = wait_for("both pods running", lambda: placed(kube, namespace, name), 120, interval=1)
    node, other = nodes["1"], nodes["0"]
    assert node != other, "both pods on one node: losing it would not be losing one pod\n" + (
        why_together(kube, namespace, name)
    )
    core = client.CoreV1Api(kube)
    with node_lost(cluster, kube, node, ready_timeout=90, dead=True):

        def stuck() -> Any:
            pod = next(
                (p for p in job_pods(kube, namespace, name) if p.metadata.name == f"{name}-1"),
                None,
            )
            return pod if pod is not None and pod.metadata.deletion_timestamp else None

        wait_for("the dead node's pod Terminating", stuck, timeout=90, interval=1)

        def restarted() -> list[Any] | None:
            pods = job_pods(kube, namespace, name)
            new = [p for p in pods if p.metadata.labels.get("torchrun.dev/attempt") == "1"]
            running = [p for p in new if p.status.phase == "Running"]
            return running if len(running) == 2 else None

        # 2 s of grace, then FORCE_DELETE_AFTER_SECONDS (120 s), then attempt 1 starts.
        pods = wait_for("attempt 1 running", restarted, timeout=240, interval=1)
        assert {p.spec.node_name for p in pods} == {other}
        assert f"{name}-1" not in {p.metadata.name for p in job_pods(kube, namespace, name)}
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        said = [e.message or "" for e in events.items if e.reason == "PodForceDeleted"]
        assert said and f"pod {name}-1 (node {node})" in said[0], said
