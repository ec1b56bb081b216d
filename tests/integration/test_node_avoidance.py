"""Node-aware recovery on the real local cluster: a node stops answering, its pod is evicted
(the not-ready/unreachable taint), and the job's next attempt keeps off that node.

The node's heartbeats are paused (localkube's process node: `<node state>/<node>/pause-heartbeat`,
cluster/localkube/node/nodes.py); the node controller marks it NotReady, taints it, and the
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
from nodes import FAST_EVICTION, node_lost, spread

pytestmark = [pytest.mark.localkube, pytest.mark.usefixtures("operator")]


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


def test_the_attempt_after_a_lost_node_keeps_off_it(
    cluster: Any, kube: client.ApiClient, namespace: str
) -> None:
    name = "lost-node-avoided"
    doc = jobs.job(
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
    apply(kube, namespace, [doc])
    core = client.CoreV1Api(kube)

    def placed() -> dict[str, str] | None:
        pods = [p for p in job_pods(kube, namespace, name) if p.status.phase == "Running"]
        by_index = {p.metadata.labels["torchrun.dev/index"]: p.spec.node_name for p in pods}
        return by_index if len(by_index) == 2 else None

    nodes = wait_for("both pods running", placed, timeout=120, interval=1)
    node, other = nodes["1"], nodes["0"]
    assert node != other, "both pods on one node: losing it would not be losing one pod"
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
