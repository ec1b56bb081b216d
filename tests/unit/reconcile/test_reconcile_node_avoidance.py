"""Node-aware recovery (reconcile/failure/avoid.py): a failure that was the node's records the
node in status.avoidedNodes with the restart decision, the next pods carry a required node
affinity that keeps them off it, an event names node and why; bounded in count and time,
cleared when the job ends; an elastic job replaces only the pod that failed there."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dtj_factory import (
    T0,
    failure,
    make_job,
    set_deleting,
    set_running,
    set_terminated,
    start,
    step,
)
from jobs import condition as cond
from reports import report
from torchrun_operator.cli.format import format_job_status
from torchrun_operator.reconcile.failure import avoid

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "failures"
ECC = next(
    m["text"]
    for m in json.loads((FIXTURES / "messages.json").read_text())
    if "uncorrectable ECC" in m["text"]
)
POLICY = {"maxRestarts": 5, "backoffSeconds": 1}


def kept_off(pod: dict[str, Any]) -> list[list[str]]:
    """Per node selector term of the pod's required node affinity, the node names it keeps
    the pod off."""
    terms = (
        pod["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    return [
        [v for f in t.get("matchFields", []) if f["operator"] == "NotIn" for v in f["values"]]
        for t in terms
    ]


def running_on(job: dict[str, Any], nodes: list[str], t: float = 2) -> tuple[Any, Any]:
    job, pods = start(job)
    pods = [set_running(p, ready=True, node=n) for p, n in zip(pods, nodes, strict=True)]
    _, job, pods = step(job, pods, t)
    return job, pods


def ecc_on(pod: dict[str, Any], t: float = 10) -> dict[str, Any]:
    node = pod["spec"]["nodeName"]
    pod = set_terminated(pod, 1, report("Failed", [2, 3], [failure(3, "exception", t, ECC)]), t=t)
    pod["spec"]["nodeName"] = node
    return pod


def settled(job: dict[str, Any], pods: list[dict[str, Any]], t: float = 30) -> Any:
    """Reconcile when the failure is seen, and again once the settle window has passed (the
    other pods' reports may name another cause)."""
    _, job, pods = step(job, pods, t)
    return step(job, pods, t + 15)


def restart_after(job: dict[str, Any], pods: list[dict[str, Any]], t: float = 30) -> Any:
    """Reconcile until the next attempt's pods are planned."""
    plan, job, pods = step(job, pods, t + 16)
    for later in (t + 20, t + 25, t + 35):
        if plan.create:
            break
        pods = [p for p in pods if "deletionTimestamp" not in p["metadata"]]
        plan, job, pods = step(job, pods, later)
    return plan, job, pods


def test_a_device_error_keeps_the_next_attempt_off_that_node() -> None:
    job, pods = running_on(make_job(nodes=2, failurePolicy=POLICY), ["n1", "n2"])
    pods[1] = ecc_on(pods[1])
    plan, job, pods = settled(job, pods)
    st = plan.status
    assert st["phase"] == "Restarting" and st["failure"]["kind"] == "gpu-device"
    [entry] = st["avoidedNodes"]
    assert (entry["node"], entry["reason"], entry["kind"], entry["index"]) == (
        "n2",
        "GPUDeviceError",
        "gpu-device",
        1,
    )
    assert [e.message for e in plan.events if e.reason == "AvoidingNode"] == [
        f"node n2: GPUDeviceError (gpu-device) of pod job-1; the job's pods keep off it "
        f"until {entry['until']}"
    ]
    plan, job, pods = restart_after(job, pods)
    assert [p["metadata"]["name"] for p in plan.create] == ["job-0-a1", "job-1-a1"]
    assert all(kept_off(p) == [["n2"]] for p in plan.create)


def test_a_lost_node_is_avoided_a_deleted_pod_is_not() -> None:
    lost = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
    job, pods = running_on(make_job(nodes=2, failurePolicy=POLICY), ["n1", "n2"])
    gone = set_deleting(pods[1], 10)
    gone["status"].setdefault("conditions", []).append(lost)
    plan, job, pods = step(job, [pods[0], gone], 12)
    assert [e["node"] for e in plan.status["avoidedNodes"]] == ["n2"]
    assert plan.status["avoidedNodes"][0]["reason"] == "DeletionByTaintManager"

    job, pods = running_on(make_job(nodes=2, failurePolicy=POLICY), ["n1", "n2"])
    plan, _, _ = step(job, [pods[0], set_deleting(pods[1], 10)], 12)
    assert plan.status["phase"] == "Restarting" and "avoidedNodes" not in plan.status


def test_a_program_error_keeps_no_node_off() -> None:
    job, pods = running_on(make_job(nodes=2, failurePolicy=POLICY), ["n1", "n2"])
    pods[1] = set_terminated(
        pods[1], 1, report("Failed", [2, 3], [failure(3, "exception", 10, "ValueError: x")])
    )
    plan, _, _ = settled(job, pods)
    assert plan.status["phase"] == "Failed" and "avoidedNodes" not in plan.status


def test_at_most_a_few_nodes_and_only_for_a_while() -> None:
    job = make_job(nodes=2, failurePolicy=POLICY)
    status: dict[str, Any] = {}
    now = T0.timestamp()
    for n in ("n1", "n2", "n3", "n4"):
        status["avoidedNodes"] = [
            *status.get("avoidedNodes", []),
            {"node": n, "reason": "GPUDeviceError", "since": "x", "until": "2100-01-01T00:00:00Z"},
        ][-avoid.MAX_NODES :]
    assert [e["node"] for e in status["avoidedNodes"]] == ["n2", "n3", "n4"]
    # One entry expired: pods rendered now keep off only the others.
    status["avoidedNodes"][0]["until"] = datetime.fromtimestamp(now - 1, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    assert [e["node"] for e in avoid.current(status, now)] == ["n3", "n4"]
    job, pods = running_on(job, ["n5", "n6"])
    job["status"]["avoidedNodes"] = copy.deepcopy(status["avoidedNodes"])
    pods[1] = ecc_on(pods[1])
    plan, job, pods = settled(job, pods)
    assert [e["node"] for e in plan.status["avoidedNodes"]] == ["n3", "n4", "n6"]
    plan, job, pods = restart_after(job, pods)
    assert all(kept_off(p) == [["n3", "n4", "n6"]] for p in plan.create)


def test_the_avoided_nodes_are_released_when_the_job_ends() -> None:
    job, pods = running_on(make_job(nodes=2, failurePolicy=POLICY), ["n1", "n2"])
    pods[1] = ecc_on(pods[1])
    plan, job, pods = settled(job, pods)
    assert plan.status["avoidedNodes"]
    plan, job, pods = restart_after(job, pods)
    pods = [
        set_running(p, ready=True, node="n1") for p in pods if p["metadata"]["name"].endswith("a1")
    ]
    _, job, pods = step(job, pods, 60)
    done = [set_terminated(p, 0, report("Succeeded", [0, 1]), t=70) for p in pods]
    plan, _, _ = step(job, done, 71)
    assert plan.status["phase"] == "Succeeded" and "avoidedNodes" not in plan.status


def test_the_templates_own_node_affinity_stays_and_is_narrowed() -> None:
    job = make_job(nodes=2, failurePolicy=POLICY)
    gpu = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100", "h200"]}]}
    big = {"matchExpressions": [{"key": "size", "operator": "In", "values": ["big"]}]}
    job["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [gpu, big]}
        }
    }
    job, pods = running_on(job, ["n1", "n2"])
    pods[1] = ecc_on(pods[1])
    _, job, pods = settled(job, pods)
    plan, _, _ = restart_after(job, pods)
    for p in plan.create:
        terms = p["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert [t["matchExpressions"] for t in terms] == [
            gpu["matchExpressions"],
            big["matchExpressions"],
        ]
        assert kept_off(p) == [["n2"], ["n2"]]
    # the job's template is untouched
    assert job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"] == [gpu, big]


def test_an_elastic_job_replaces_only_the_pod_on_the_bad_node_elsewhere() -> None:
    job = make_job(nodes=3, elastic={"minNodes": 2}, failurePolicy=POLICY)
    job, pods = running_on(job, ["n1", "n2", "n3"])
    pods[2] = ecc_on(pods[2])
    plan, _, _ = step(job, pods, 20)
    assert [p["metadata"]["name"] for p in plan.create] == ["job-2-a0r1"]
    assert plan.delete == [] and plan.status["attempt"] == 0
    assert kept_off(plan.create[0]) == [["n3"]]
    assert [e["node"] for e in plan.status["avoidedNodes"]] == ["n3"]


def test_kubectl_dtj_status_shows_the_avoided_nodes() -> None:
    job, pods = running_on(make_job(nodes=2, failurePolicy=POLICY), ["n1", "n2"])
    pods[1] = ecc_on(pods[1])
    plan, job, _ = settled(job, pods)
    text = format_job_status(job, T0)
    block = text.split("Avoided nodes (the job's pods keep off them):\n", 1)[1]
    header, row = block.splitlines()[:2]
    assert header.split() == ["NODE", "REASON", "KIND", "INDEX", "SINCE", "UNTIL"]
    assert row.split()[:4] == ["n2", "GPUDeviceError", "gpu-device", "1"]


def test_an_elastic_replacement_finds_the_device_error_among_the_pods_failures() -> None:
    """The pod's report lists the rank torchrun stopped (SIGTERM) after the ECC error."""
    job = make_job(nodes=3, elastic={"minNodes": 2}, failurePolicy=POLICY)
    job, pods = running_on(job, ["n1", "n2", "n3"])
    failures = [failure(5, "exception", 10, ECC), failure(4, "signal", 11, exit_code=-15)]
    pods[2] = set_terminated(pods[2], 1, report("Failed", [4, 5], failures), t=11)
    pods[2]["spec"]["nodeName"] = "n3"
    plan, _, _ = step(job, pods, 20)
    assert [e["node"] for e in plan.status["avoidedNodes"]] == ["n3"]
    assert kept_off(plan.create[0]) == [["n3"]]
    assert [e.reason for e in plan.events].count("AvoidingNode") == 1


def test_a_node_whose_time_is_up_leaves_the_status_and_the_next_pods() -> None:
    job, pods = running_on(make_job(nodes=2, failurePolicy=POLICY), ["n1", "n2"])
    pods[1] = ecc_on(pods[1])
    plan, job, pods = settled(job, pods)
    until = plan.status["avoidedNodes"][0]["until"]
    plan, job, pods = restart_after(job, pods)
    assert all(kept_off(p) == [["n2"]] for p in plan.create)
    later = (datetime.fromisoformat(until.replace("Z", "+00:00")) - T0).total_seconds() + 1
    plan, _, _ = step(job, pods, later)
    assert "avoidedNodes" not in plan.status


def test_the_failed_ranks_reason_says_what_failed() -> None:
    job, pods = running_on(make_job(nodes=2, failurePolicy=POLICY), ["n1", "n2"])
    pods[1] = ecc_on(pods[1])
    plan, _, _ = step(job, pods, 30)
    assert plan.status["ranks"][1]["reason"] == "GPUDeviceError"


# ---- pods kept off a node no longer avoided (issue 45) --------------------------------------

# What kube-scheduler says of a pod whose required node affinity rules out the only free node.
KEPT_OFF = (
    "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's "
    "node affinity/selector. preemption: 0/2 nodes are available: 2 Preemption is not helpful."
)
NO_ROOM = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def unschedulable(pod: dict[str, Any], message: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    pod["status"] = {"phase": "Pending", "conditions": [{**scheduled, "message": message}]}
    return pod


def waiting_off_n2(
    message: str = KEPT_OFF, **spec: Any
) -> tuple[dict[str, Any], list[dict[str, Any]], str, float]:
    """A 2-pod job on a pool of two nodes: an ECC error on n2 restarts it, and the next
    attempt's pods, kept off n2, wait for the scheduler (a gang places both or neither). The
    job, its pods, when n2's time is up (as in the status, and in seconds after T0)."""
    job, pods = running_on(make_job(nodes=2, failurePolicy=POLICY, **spec), ["n1", "n2"])
    pods[1] = ecc_on(pods[1])
    plan, job, pods = settled(job, pods)
    until = plan.status["avoidedNodes"][0]["until"]
    plan, job, pods = restart_after(job, pods)
    assert all(kept_off(p) == [["n2"]] for p in plan.create)
    pods = [unschedulable(p, message) for p in pods if p["metadata"]["name"].endswith("-a1")]
    later = (datetime.fromisoformat(until.replace("Z", "+00:00")) - T0).total_seconds()
    return job, pods, until, later


def test_a_job_that_waits_because_of_avoided_nodes_says_so() -> None:
    job, pods, until, later = waiting_off_n2(scheduling={"gang": "Native"})
    plan, job, pods = step(job, pods, 100)
    st = plan.status
    assert st["phase"] == "Waiting"
    c = cond(st, "Scheduled")
    assert c is not None and (c["status"], c["reason"]) == ("False", "AvoidedNodes")
    assert c["message"].startswith("2 of 2 pods not scheduled; Native gang scheduling places 2")
    assert f"the job keeps its pods off avoided nodes n2 (until {until})" in c["message"]
    assert "created again without a node once that node is no longer avoided" in c["message"]
    assert [e.reason for e in plan.events] == ["Waiting"]
    # The operator looks again when n2's time is up, whatever else wakes it.
    assert plan.requeue_after == later - 100


def test_pods_waiting_for_room_are_not_said_to_wait_for_avoided_nodes() -> None:
    job, pods, _, _ = waiting_off_n2(NO_ROOM)
    plan, _, _ = step(job, pods, 100)
    c = cond(plan.status, "Scheduled")
    assert c is not None and c["reason"] == "Unschedulable" and "avoided" not in c["message"]


def test_a_waiting_pod_kept_off_a_node_no_longer_avoided_is_created_again_without_it() -> None:
    job, pods, _, later = waiting_off_n2(scheduling={"gang": "Native"})
    plan, job, pods = step(job, pods, 100)
    restarts = plan.status["counters"]["restarts"]
    # n2's time is up: both pods of the gang go, to be created again under their names.
    plan, job, pods = step(job, pods, later + 1)
    st = plan.status
    assert "avoidedNodes" not in st
    assert sorted(plan.delete) == ["job-0-a1", "job-1-a1"] and plan.create == []
    assert [(r["pod"], r["phase"], r["reason"]) for r in st["ranks"]] == [
        ("job-0-a1", "Creating", "AvoidanceLifted"),
        ("job-1-a1", "Creating", "AvoidanceLifted"),
    ]
    assert st["ranks"][1]["message"] == "kept off n2, no longer avoided: created again without it"
    assert [e.message for e in plan.events if e.reason == "AvoidanceLifted"] == [
        "pod job-0-a1 (index 0): kept off n2, no longer avoided: created again without it",
        "pod job-1-a1 (index 1): kept off n2, no longer avoided: created again without it",
    ]
    c = cond(st, "Scheduled")
    assert c is not None and (c["status"], c["reason"]) == ("False", "AvoidanceLifted")
    # Their going is the decision, not a failure: no restart, the same attempt.
    assert (st["attempt"], st["counters"]["restarts"], st["phase"]) == (1, restarts, "Waiting")
    assert all("deletionTimestamp" in p["metadata"] for p in pods)
    plan, job, pods = step(job, pods, later + 2)
    assert plan.status["phase"] != "Restarting" and plan.create == []
    assert plan.events == []
    # Once gone, they are created again, kept off no node, in the attempt's own PodGroup.
    plan, job, pods = step(
        job, [p for p in pods if "deletionTimestamp" not in p["metadata"]], later + 3
    )
    assert [p["metadata"]["name"] for p in plan.create] == ["job-0-a1", "job-1-a1"]
    assert all(kept_off(p) == [] for p in plan.create)
    assert all("annotations" not in p["metadata"] for p in plan.create)
    group = plan.status["scheduling"]["podGroup"]
    assert group == "job-a1"
    assert all(p["spec"]["schedulingGroup"] == {"podGroupName": group} for p in plan.create)
    assert plan.status["counters"]["restarts"] == restarts
    # Placed now: running, as any attempt.
    pods = [set_running(p, ready=True, node=n) for p, n in zip(pods, ["n1", "n2"], strict=True)]
    plan, _, _ = step(job, pods, later + 10)
    assert plan.status["phase"] == "Running" and plan.delete == []
    c = cond(plan.status, "Scheduled")
    assert c is not None and (c["status"], c["reason"]) == ("True", "AllPodsScheduled")


def test_a_recreated_pod_seen_bound_before_it_went_is_not_a_failure() -> None:
    """The scheduler bound the pods between the decision and the delete: they are deleted
    all the same (seen before the delete, and while it runs), and their going spends
    nothing."""
    job, pods, _, later = waiting_off_n2()
    plan, job, pods = step(job, pods, later + 1)
    assert sorted(plan.delete) == ["job-0-a1", "job-1-a1"]
    failed, counters = plan.status["failure"], plan.status["counters"]
    for p in pods:
        p["metadata"].pop("deletionTimestamp")
    bound = [set_running(p, node="n1") for p in pods]
    plan, job, pods = step(job, bound, later + 2)
    assert sorted(plan.delete) == ["job-0-a1", "job-1-a1"]
    plan, job, pods = step(job, pods, later + 3)
    st = plan.status
    assert st["phase"] != "Restarting" and st["attempt"] == 1
    assert (st["failure"], st["counters"]) == (failed, counters)  # the ECC error's, as before
    assert [r["reason"] for r in st["ranks"]] == ["AvoidanceLifted"] * 2
    assert all("deletionTimestamp" in p["metadata"] for p in pods)


def test_a_placed_pod_keeps_its_affinity_when_the_node_is_no_longer_avoided() -> None:
    job, pods, _, later = waiting_off_n2()
    pods = [set_running(p, ready=True, node="n1") for p in pods]
    plan, job, pods = step(job, pods, 100)
    plan, _, _ = step(job, pods, later + 1)
    assert "avoidedNodes" not in plan.status
    assert plan.delete == [] and plan.create == []
    assert plan.status["phase"] == "Running"
    assert [e.reason for e in plan.events if e.reason == "AvoidanceLifted"] == []


def test_a_pod_still_kept_off_an_avoided_node_waits() -> None:
    job, pods, _, later = waiting_off_n2()
    plan, _, _ = step(job, pods, later - 1)
    assert plan.delete == [] and plan.status["avoidedNodes"]
    assert plan.requeue_after is not None and plan.requeue_after <= 1
