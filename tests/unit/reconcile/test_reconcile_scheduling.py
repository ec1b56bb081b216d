"""Reconcile decisions for spec.scheduling: the status names the attempt's gang objects, and
the phase and the Scheduled condition say why pods wait for the scheduler."""

from __future__ import annotations

import copy
from typing import Any

from dtj_factory import make_job, set_running, start, step
from jobs import condition as cond


def unschedulable(pod: dict[str, Any], message: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ],
    }
    return pod


def test_status_names_the_attempts_gang_before_pods_exist() -> None:
    job, pods = start(make_job(nodes=3, scheduling={"gang": "Native"}))
    assert job["status"]["scheduling"] == {"gang": "Native", "attempt": 0, "podGroup": "job-a0"}
    assert len(pods) == 3


def test_no_gang_no_scheduling_status() -> None:
    job, _ = start(make_job())
    assert "scheduling" not in job["status"]


def test_a_gang_that_does_not_fit_waits_with_the_schedulers_words() -> None:
    job, pods = start(make_job(nodes=2, scheduling={"gang": "Native"}))
    msg = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    pods = [unschedulable(p, msg) for p in pods]
    plan, job, pods = step(job, pods, 5)
    st = plan.status
    assert st["phase"] == "Waiting"
    c = cond(st, "Scheduled")
    assert c is not None and c["status"] == "False" and c["reason"] == "Unschedulable"
    assert c["message"].startswith("2 of 2 pods not scheduled; Native gang scheduling places 2")
    assert "(PodGroup job-a0)" in c["message"] and msg in c["message"]
    assert [e.reason for e in plan.events] == ["Waiting"]
    # Once placed and running: Running, and the condition flips.
    pods = [set_running(p, True) for p in pods]
    plan, job, pods = step(job, pods, 30)
    assert plan.status["phase"] == "Running"
    c = cond(plan.status, "Scheduled")
    assert c is not None and c["status"] == "True" and c["reason"] == "AllPodsScheduled"


def test_pending_pods_the_scheduler_said_nothing_about_are_just_starting() -> None:
    job, pods = start(make_job(nodes=2))
    plan, job, pods = step(job, pods, 1)
    assert plan.status["phase"] == "Starting"
    assert cond(plan.status, "Scheduled") is None


def test_waiting_again_emits_no_second_event() -> None:
    job, pods = start(make_job(nodes=2))
    pods = [unschedulable(p, "0/2 nodes are available") for p in pods]
    plan, job, pods = step(job, pods, 1)
    assert [e.reason for e in plan.events] == ["Waiting"]
    plan, job, pods = step(job, pods, 2)
    assert plan.events == []
    assert plan.status["phase"] == "Waiting"
