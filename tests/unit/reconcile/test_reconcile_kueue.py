"""Kueue admission: what the job does while its Workload waits, runs, is evicted and is
admitted again (reconcile/admission.py and the reconciler's Queued phase)."""

from __future__ import annotations

import copy
from typing import Any

from dtj_factory import UID, apply, at, drop_terminating, make_job, set_running
from jobs import condition as cond
from torchrun_operator.reconcile import reconcile
from torchrun_operator.reconcile.admission import (
    NAMESPACE_UNREAD_RETRY_SECONDS,
    Admission,
    admission,
    namespace_unread,
    pods_left,
    workload_actions,
)
from torchrun_operator.render import kueue

QUEUE = {kueue.QUEUE_LABEL: "q"}


def queued_job(**spec: Any) -> dict[str, Any]:
    job = make_job(**spec)
    job["metadata"]["labels"] = dict(QUEUE)
    return job


def workload(
    job: dict[str, Any], *conds: tuple[str, str, str, str], **extra: Any
) -> dict[str, Any]:
    wl = kueue.render_workload(job)
    wl["metadata"].update(uid="wl-uid", resourceVersion="7", generation=1)
    wl["status"] = {
        "conditions": [
            {
                "type": t,
                "status": s,
                "reason": r,
                "message": m,
                "lastTransitionTime": "2025-01-01T11:00:00Z",
            }
            for t, s, r, m in conds
        ],
        **extra,
    }
    return wl


PENDING = (
    "QuotaReserved",
    "False",
    "Pending",
    "couldn't assign flavors to pod set workers: insufficient unused quota for cpu in flavor "
    "default, 2 more needed",
)
RESERVED = ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq")
ADMITTED = ("Admitted", "True", "Admitted", "The workload is admitted")
PREEMPTED = ("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x)")
ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [{"name": "workers", "flavors": {"cpu": "default"}}],
}


# ---- what Kueue says ---------------------------------------------------------------------


def test_a_job_without_a_queue_label_is_not_kueues() -> None:
    assert admission(make_job(), None) is None


def test_the_reason_and_message_are_kueues_own() -> None:
    job = queued_job()
    assert admission(job, None) == Admission(
        False, "WorkloadCreating", "creating its Workload in queue q"
    )
    waiting = admission(job, workload(job, PENDING))
    assert waiting == Admission(False, "Pending", PENDING[3])
    running = admission(job, workload(job, RESERVED, ADMITTED, admission=ADMISSION))
    assert running is not None and running.admitted and "by ClusterQueue cq" in running.message
    evicted = admission(job, workload(job, RESERVED, ADMITTED, PREEMPTED, admission=ADMISSION))
    assert evicted == Admission(False, "Preempted", PREEMPTED[3])
    # Released and waiting again: still the eviction's reason, with what Kueue says now.
    requeued = admission(job, workload(job, PREEMPTED, PENDING))
    assert requeued == Admission(False, "Preempted", f"{PREEMPTED[3]}; now: {PENDING[3]}")
    inactive = workload(job)
    inactive["spec"]["active"] = False
    verdict = admission(job, inactive)
    assert verdict is not None and verdict.reason == "Inactive" and not verdict.admitted


# ---- the job while it waits, runs, is evicted and readmitted ------------------------------


def test_nothing_starts_before_admission_and_the_status_says_why() -> None:
    job = queued_job()
    verdict = admission(job, workload(job, PENDING))
    plan = reconcile(job, [], at(0), admission=verdict)
    assert plan.create == []
    assert plan.status["phase"] == "Queued"
    admitted = cond(plan.status, "Admitted")
    assert admitted["status"] == "False" and admitted["reason"] == "Pending"
    assert "insufficient unused quota" in admitted["message"]
    assert [e.reason for e in plan.events] == ["Queued"]
    # Deciding again changes nothing and says nothing new.
    again = reconcile({**job, "status": plan.status}, [], at(1), admission=verdict)
    assert again.create == [] and again.events == [] and again.status == plan.status


def test_eviction_suspends_without_spending_the_budget_and_readmission_resumes() -> None:
    job = queued_job(failurePolicy={"maxRestarts": 0})
    wl = workload(job, RESERVED, ADMITTED, admission=ADMISSION)
    plan = reconcile(job, [], at(0), admission=admission(job, wl))
    assert [p["metadata"]["name"] for p in plan.create] == ["job-0", "job-1"]
    assert cond(plan.status, "Admitted")["status"] == "True"
    job, pods = apply(job, [], plan, 0)
    pods = [set_running(p, ready=True) for p in pods]
    plan = reconcile(job, pods, at(2), admission=admission(job, wl))
    job, pods = apply(job, pods, plan, 2)
    assert plan.status["phase"] == "Running"

    evicted = workload(job, RESERVED, ADMITTED, PREEMPTED, admission=ADMISSION)
    plan = reconcile(job, pods, at(3), admission=admission(job, evicted))
    # Intent first: the status says Queued (why, in Kueue's words) in the plan that deletes.
    assert sorted(plan.delete) == ["job-0", "job-1"] and plan.create == []
    assert plan.status["phase"] == "Queued"
    assert cond(plan.status, "Admitted")["reason"] == "Preempted"
    assert cond(plan.status, "Running")["status"] == "False"
    assert {e.reason for e in plan.events} == {"Evicted", "Queued"}
    job, pods = apply(job, pods, plan, 3)
    # The pods' deletion is no failure: nothing counted while they go.
    plan = reconcile(job, pods, at(4), admission=admission(job, evicted))
    job, pods = apply(job, pods, plan, 4)
    assert plan.status["counters"] == {
        "userFailures": 0,
        "infrastructureFailures": 0,
        "restarts": 0,
    }
    assert plan.status["phase"] == "Queued"

    readmitted = workload(job, RESERVED, ADMITTED, admission=ADMISSION)
    plan = reconcile(job, drop_terminating(pods), at(9), admission=admission(job, readmitted))
    assert [p["metadata"]["name"] for p in plan.create] == ["job-0-a1", "job-1-a1"]
    assert plan.status["attempt"] == 1 and plan.status["phase"] == "Starting"
    assert plan.status["counters"]["restarts"] == 0
    [record] = plan.status["restarts"]
    assert record["kind"] == "suspend" and record["reason"] == "Preempted"
    assert cond(plan.status, "Admitted")["status"] == "True"


def test_first_admission_starts_attempt_zero_without_a_restart_record() -> None:
    job = queued_job()
    plan = reconcile(job, [], at(0), admission=admission(job, workload(job, PENDING)))
    job = {**job, "status": plan.status}
    wl = workload(job, RESERVED, ADMITTED, admission=ADMISSION)
    plan = reconcile(job, [], at(5), admission=admission(job, wl))
    assert [p["metadata"]["name"] for p in plan.create] == ["job-0", "job-1"]
    assert plan.status["attempt"] == 0 and "restarts" not in plan.status


# ---- what the operator does to its Workload -----------------------------------------------


def own(phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    """One of the job's pods (controller uid), in `phase`."""
    meta: dict[str, Any] = {"ownerReferences": [{"uid": UID, "controller": True}]}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T12:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def kinds(actions: list[Any]) -> list[str]:
    return [a.kind for a in actions]


def test_the_workload_is_created_deactivated_when_the_job_is_suspended() -> None:
    job = queued_job()
    [create] = workload_actions(job, {"phase": "Queued"}, None, [], at(0).timestamp())
    assert create.kind == "create" and "active" not in create.body["spec"]
    suspended = queued_job(runPolicy={"suspend": True})
    [create] = workload_actions(suspended, {"phase": "Suspended"}, None, [], at(0).timestamp())
    assert create.body["spec"]["active"] is False


def test_suspend_deactivates_and_resume_reactivates_only_what_the_operator_deactivated() -> None:
    job = queued_job(runPolicy={"suspend": True})
    wl = workload(job, RESERVED, ADMITTED, admission=ADMISSION)
    [act] = workload_actions(job, {"phase": "Suspended"}, wl, [], 0)
    assert act.kind == "set_active" and act.body["spec"] == {"active": False}
    assert act.body["metadata"]["annotations"][kueue.DEACTIVATED_ANNOTATION] == "true"
    resumed = queued_job()
    ours = workload(resumed)
    ours["spec"]["active"] = False
    ours["metadata"]["annotations"][kueue.DEACTIVATED_ANNOTATION] = "true"
    [act] = workload_actions(resumed, {"phase": "Queued"}, ours, [], 0)
    assert act.body == {
        "metadata": {"annotations": {kueue.DEACTIVATED_ANNOTATION: None}},
        "spec": {"active": True},
    }
    # Deactivated by someone else (kubectl, Kueue): left as it is.
    theirs = workload(resumed)
    theirs["spec"]["active"] = False
    assert workload_actions(resumed, {"phase": "Queued"}, theirs, [], 0) == []


def test_quota_is_released_after_an_eviction_only_once_every_pod_is_gone() -> None:
    job = queued_job()
    wl = workload(job, RESERVED, ADMITTED, PREEMPTED, admission=ADMISSION)
    assert workload_actions(job, {"phase": "Queued"}, wl, [own()], at(60).timestamp()) == []
    [act] = workload_actions(job, {"phase": "Queued"}, wl, [], at(60).timestamp())
    assert act.kind == "patch_status"
    status = act.body
    assert "admission" not in status
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False"
    assert by_type["QuotaReserved"]["reason"] == "Pending"
    assert by_type["Admitted"]["status"] == "False"
    # Preempted: requeued at once, as Kueue's own job integrations do it.
    assert by_type["Requeued"]["status"] == "True" and by_type["Requeued"]["reason"] == "Preempted"
    assert by_type["Evicted"] == wl["status"]["conditions"][2]
    assert status["accumulatedPastExecutionTimeSeconds"] == 3660  # admitted at 11:00, now 12:01
    deactivated = workload(
        job, RESERVED, ADMITTED, ("Evicted", "True", "Deactivated", "The workload is deactivated")
    )
    [act] = workload_actions(job, {"phase": "Queued"}, deactivated, [], 0)
    requeued = next(c for c in act.body["conditions"] if c["type"] == "Requeued")
    # Kueue requeues it itself when it is reactivated.
    assert requeued["status"] == "False" and requeued["reason"] == "Deactivated"


def test_a_finished_job_finishes_its_workload_which_frees_the_quota() -> None:
    job = queued_job()
    wl = workload(job, RESERVED, ADMITTED, admission=ADMISSION)
    status = {
        "phase": "Succeeded",
        "conditions": [{"type": "Succeeded", "status": "True", "message": "all 2 pods succeeded"}],
    }
    ended = [own("Succeeded"), own("Succeeded")]  # kept (cleanPodPolicy), holding nothing
    [act] = workload_actions(job, status, wl, ended, at(0).timestamp())
    finished = next(c for c in act.body["conditions"] if c["type"] == "Finished")
    assert finished["status"] == "True" and finished["reason"] == "Succeeded"
    assert finished["message"] == "all 2 pods succeeded"
    done = copy.deepcopy(wl)
    done["status"]["conditions"].append({"type": "Finished", "status": "True"})
    assert workload_actions(job, status, done, ended, 0) == []


def test_a_finished_job_frees_its_quota_only_once_no_pod_of_it_runs() -> None:
    """As after an eviction: Finished (Kueue then releases the quota) waits while any pod
    of the job may still hold its node's resources (running, pending, or terminating and
    not yet stopped), so Kueue does not admit another job onto GPUs still in use."""
    job = queued_job()
    wl = workload(job, RESERVED, ADMITTED, admission=ADMISSION)
    status = {
        "phase": "Failed",
        "conditions": [{"type": "Failed", "status": "True", "message": "deadline passed"}],
    }
    for still in (
        [own("Failed"), own("Running", deleting=True)],
        [own("Pending")],
        [own("Running")],
    ):
        assert workload_actions(job, status, wl, still, at(0).timestamp()) == [], still
    for stopped in ([], [own("Failed")], [own("Failed"), own("Succeeded", deleting=True)]):
        [act] = workload_actions(job, status, wl, stopped, at(0).timestamp())
        assert act.kind == "patch_status", stopped
        finished = next(c for c in act.body["conditions"] if c["type"] == "Finished")
        assert finished["reason"] == "Failed"
    # Someone else's pod running under the job's name holds nothing of the job's quota.
    other = own("Running")
    other["metadata"]["ownerReferences"][0]["uid"] = "else"
    assert kinds(workload_actions(job, status, wl, [other], 0)) == ["patch_status"]


def test_a_job_changed_while_it_waits_gets_a_new_workload_but_not_one_holding_quota() -> None:
    job = queued_job()
    old = workload(job, PENDING)
    changed = queued_job(nodes=3)
    [act] = workload_actions(changed, {"phase": "Queued"}, old, [], 0)
    assert act.kind == "delete"
    holding = workload(job, RESERVED, ADMITTED, admission=ADMISSION)
    assert workload_actions(changed, {"phase": "Running"}, holding, [own(), own()], 0) == []


def test_a_missing_priority_class_holds_the_workload_back_and_says_so() -> None:
    job = queued_job()
    job["metadata"]["labels"][kueue.PRIORITY_LABEL] = "high"
    verdict = admission(job, None, priority=None)
    assert verdict is not None and verdict.reason == "WorkloadPriorityClassNotFound"
    assert "WorkloadPriorityClass high not found" in verdict.message
    assert workload_actions(job, {"phase": "Queued"}, None, [], 0, priority=None) == []
    [create] = workload_actions(job, {"phase": "Queued"}, None, [], 0, priority=7)
    assert create.body["spec"]["priority"] == 7


def test_removing_the_queue_label_deletes_the_workload() -> None:
    job = queued_job()
    wl = workload(job, PENDING)
    plain = make_job()
    assert kinds(workload_actions(plain, {"phase": "Queued"}, wl, [], 0)) == ["delete"]
    assert workload_actions(plain, {"phase": "Running"}, None, [], 0) == []


def test_pods_left_counts_only_the_jobs_own_pods() -> None:
    mine = {"metadata": {"ownerReferences": [{"uid": UID, "controller": True}]}}
    other = {"metadata": {"ownerReferences": [{"uid": "else", "controller": True}]}}
    orphan: dict[str, Any] = {"metadata": {}}
    assert pods_left([mine, other, orphan, mine], UID) == 2


UNREAD = (
    "QuotaReserved",
    "False",
    "Pending",
    'Could not obtain workload namespace: Namespace "ns" not found',
)


def test_a_workload_kueue_could_not_read_the_namespace_of_is_replaced_after_the_retry() -> None:
    job = queued_job()
    wl = workload(job, UNREAD)
    now = at(0).timestamp()
    retry = NAMESPACE_UNREAD_RETRY_SECONDS
    assert namespace_unread(wl)
    assert workload_actions(job, {"phase": "Queued"}, wl, [], now, unread_since=None) == []
    assert workload_actions(job, {"phase": "Queued"}, wl, [], now, unread_since=now - 1) == []
    [act] = workload_actions(job, {"phase": "Queued"}, wl, [], now, unread_since=now - retry)
    assert act.kind == "delete" and "namespace" in act.why
    # After an eviction, once the quota is released, Kueue's next try can fail the same way.
    evicted = workload(job, UNREAD, PREEMPTED)
    assert kinds(workload_actions(job, {"phase": "Queued"}, evicted, [], now, None, 0)) == [
        "delete"
    ]
    # Suspended (deactivated) it waits for the job, not for Kueue.
    suspended = queued_job(runPolicy={"suspend": True})
    off = workload(suspended, UNREAD)
    off["spec"]["active"] = False
    assert workload_actions(suspended, {"phase": "Suspended"}, off, [], now, None, 0) == []


def test_only_kueues_namespace_read_failure_counts_as_unread() -> None:
    job = queued_job()
    assert not namespace_unread(workload(job, PENDING))
    assert not namespace_unread(workload(job, RESERVED, ADMITTED))
    assert not namespace_unread(workload(job))
    waited = workload(job, PENDING)
    assert workload_actions(job, {"phase": "Queued"}, waited, [], 1e9, None, 0) == []
