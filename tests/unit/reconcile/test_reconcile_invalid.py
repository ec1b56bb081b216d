"""A spec the model refuses (InvalidSpec) ends the job like any other failure: its pods go per
runPolicy.cleanPodPolicy (the status saying Failed is written before they are deleted) and
runPolicy.ttlSecondsAfterFinished applies, on the reconcile that fails it and on every later
one (issue 25, item 6: the pods of a running job were left running, the TTL ignored)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from dtj_factory import apply, at, make_job, set_running, set_terminated, start, step
from jobs import condition as cond
from torchrun_operator.reconcile import reconcile


def running_job(**spec: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    job, pods = start(make_job(**spec))
    _, job, pods = step(job, [set_running(p, ready=True) for p in pods], 2)
    assert job["status"]["phase"] == "Running"
    return job, pods


def made_invalid(job: dict[str, Any]) -> dict[str, Any]:
    """The job as a write the model refuses leaves it (a torchrun flag in the trainer's
    command that sets what the spec sets: more than the CRD's CEL rules can see)."""
    job = copy.deepcopy(job)
    job["spec"]["template"]["spec"]["containers"][0]["command"] = [
        "torchrun",
        "--nproc-per-node",
        "1",
        "--nnodes",
        "2",
        "t.py",
    ]
    job["metadata"]["generation"] = 2
    return job


def test_invalid_spec_on_a_running_job_fails_it_and_deletes_its_pods() -> None:
    job, pods = running_job()
    plan = reconcile(made_invalid(job), pods, at(10))
    assert plan.status["phase"] == "Failed"
    failed = cond(plan.status, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert cond(plan.status, "Running")["status"] == "False"
    assert plan.status["completionTime"] and plan.status["observedGeneration"] == 2
    # The default cleanPodPolicy (KeepFailed) deletes the running pods.
    assert sorted(plan.delete) == ["job-0", "job-1"] and plan.create == []
    # Announced as any failure is: a Failed event with the model's words.
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "Failed")]
    assert plan.events[0].message.startswith("invalid spec: ")


def test_later_reconciles_finish_the_clean_up_from_the_status_alone() -> None:
    """The status (Failed) was written but the deletes were lost: the next reconcile of the
    finished job deletes the pods again, and fails nothing twice."""
    job, pods = running_job()
    bad = made_invalid(job)
    plan = reconcile(bad, pods, at(10))
    failed = {**bad, "status": plan.status}
    again = reconcile(failed, pods, at(12))
    assert sorted(again.delete) == ["job-0", "job-1"]
    assert again.status == plan.status and again.events == [] and again.transitions == []


@pytest.mark.parametrize(
    ("policy", "deleted"),
    [("KeepFailed", ["job-1"]), ("Delete", ["job-0", "job-1"]), ("KeepAll", [])],
)
def test_clean_pod_policy_decides_which_pods_go(policy: str, deleted: list[str]) -> None:
    job, pods = running_job(runPolicy={"cleanPodPolicy": policy})
    pods = [set_terminated(pods[0], 1), pods[1]]  # pod 0 failed, pod 1 still running
    plan = reconcile(made_invalid(job), pods, at(10))
    assert plan.status["phase"] == "Failed"
    assert sorted(plan.delete) == deleted


def test_ttl_after_finished_applies_to_an_invalid_spec() -> None:
    job, pods = running_job(runPolicy={"ttlSecondsAfterFinished": 60})
    bad = made_invalid(job)
    plan = reconcile(bad, pods, at(10))
    assert plan.requeue_after == pytest.approx(60) and not plan.delete_job
    failed, pods = apply(bad, pods, plan, 10)
    plan = reconcile(failed, pods, at(40))
    assert plan.requeue_after == pytest.approx(30) and not plan.delete_job
    plan = reconcile(failed, pods, at(71))
    assert plan.delete_job


def test_an_invalid_run_policy_ends_the_job_by_the_defaults() -> None:
    """The policy itself is what is invalid: the pods go as by default (KeepFailed)."""
    job, pods = running_job()
    bad = copy.deepcopy(job)
    bad["spec"]["runPolicy"] = {"cleanPodPolicy": "Sometimes", "ttlSecondsAfterFinished": 5}
    plan = reconcile(bad, pods, at(10))
    assert cond(plan.status, "Failed")["reason"] == "InvalidSpec"
    assert sorted(plan.delete) == ["job-0", "job-1"]
    assert not plan.delete_job and plan.requeue_after is None


def test_pods_that_are_not_the_jobs_are_never_deleted() -> None:
    job, pods = running_job()
    foreign = copy.deepcopy(pods[1])
    foreign["metadata"]["name"] = "job-9"
    foreign["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    plan = reconcile(made_invalid(job), [*pods, foreign], at(10))
    assert sorted(plan.delete) == ["job-0", "job-1"]
