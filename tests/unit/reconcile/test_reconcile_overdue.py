"""Pods whose deletion no kubelet finishes (a node that is gone) are deleted with a grace
period of 0 once overdue (reconcile/overdue.py): a gang restart waits for the last attempt's
pods to be gone, and without it would wait for ever."""

from __future__ import annotations

from typing import Any

import pytest
from dtj_factory import at, make_job, set_deleting, set_running, set_terminated, start, step
from torchrun_operator.reconcile import reconcile
from torchrun_operator.reconcile.overdue import FORCE_DELETE_AFTER_SECONDS

RESTARTING: dict[str, Any] = {"failurePolicy": {"maxRestarts": 1, "backoffSeconds": 0}}


def restarting() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A gang restart decided at 40: pod 1 was lost, pod 0 was deleted at 40 and its node
    never confirms."""
    job, pods = start(make_job(nodes=2, **RESTARTING))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 5)
    plan, job, pods = step(job, [pods[0]], 40)  # pod 1 gone: a gang restart
    assert plan.status["phase"] == "Restarting" and plan.delete == ["job-0"]
    return job, pods


def test_a_pod_still_terminating_long_after_its_grace_period_is_deleted_by_force() -> None:
    job, pods = restarting()
    assert pods[0]["metadata"]["deletionTimestamp"]  # deleted at 40 (grace included)
    due = 40 + FORCE_DELETE_AFTER_SECONDS
    plan, job, pods = step(job, pods, due - 1)
    assert plan.force_delete == [] and plan.create == []
    assert plan.requeue_after == pytest.approx(1)  # no pod event comes from a dead node
    plan, _, _ = step(job, pods, due)
    assert plan.force_delete == ["job-0"]
    assert plan.create == []  # the next attempt starts once the pod is gone
    (event,) = [e for e in plan.events if e.reason == "PodForceDeleted"]
    assert event.type == "Warning" and "job-0" in event.message
    # Gone: the next attempt starts.
    plan, _, _ = step(job, [], due + 1)
    assert plan.status["attempt"] == 1 and len(plan.create) == 2


def test_a_pod_that_ended_after_its_delete_is_forced_too_one_not_deleting_never() -> None:
    # It ended (its peer was deleted) and its node died before its kubelet's final delete.
    job, pods = restarting()
    ended = set_deleting(set_terminated(pods[0], 1, reason="Error"), 40)
    plan, _, _ = step(job, [ended], 40 + FORCE_DELETE_AFTER_SECONDS)
    assert plan.force_delete == ["job-0"]
    job, pods = start(make_job(nodes=2))
    running = [set_running(p, ready=True) for p in pods]
    assert reconcile(job, running, at(10_000)).force_delete == []
