"""Builders for reconcile tests: jobs, pods in every state, and applying a plan."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import jobs
import reports
from torchrun_operator.launcher import contract
from torchrun_operator.reconcile import Plan, reconcile

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
UID = "uid-1"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iso(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_job(
    name: str = "job", nodes: int = 2, status: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    metadata = {"namespace": "ns", "uid": UID, "generation": 1}
    return jobs.job(
        name,
        nodes=nodes,
        nproc=2,
        command=["python", "t.py"],
        metadata=metadata,
        status=status or {},
        **spec,
    )


def failure(
    rank: int, kind: contract.FailureKind, t: float, error: str = "", exit_code: int = 1
) -> contract.FailureRecord:
    """A failed worker of the launcher's report, `t` seconds after T0."""
    return reports.failure(rank, kind, at(t).timestamp(), error, exit_code)


def set_running(
    pod: dict[str, Any], ready: bool = False, node: str = "n1", t: float = 1
) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeName"] = node
    pod["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "trainer", "state": {"running": {"startedAt": iso(t)}}}],
    }
    return pod


def set_terminated(
    pod: dict[str, Any],
    exit_code: int,
    message: str | None = None,
    reason: str | None = None,
    t: float = 10,
    pod_reason: str | None = None,
) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"].setdefault("nodeName", "n1")
    term: dict[str, Any] = {"exitCode": exit_code, "startedAt": iso(1), "finishedAt": iso(t)}
    term["reason"] = reason or ("Completed" if exit_code == 0 else "Error")
    if message is not None:
        term["message"] = message
    pod["status"] = {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [{"name": "trainer", "state": {"terminated": term}}],
    }
    if pod_reason:
        pod["status"]["reason"] = pod_reason
    return pod


def set_deleting(pod: dict[str, Any], t: float = 5) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"]["deletionTimestamp"] = iso(t)
    return pod


def apply(
    job: dict[str, Any], pods: list[dict[str, Any]], plan: Plan, t: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What the shell would do: deletes mark pods terminating, forced deletes remove them (the
    apiserver drops a pod deleted with grace 0 at once), creates add Pending pods."""
    out = []
    for p in pods:
        if p["metadata"]["name"] in plan.force_delete:
            continue
        if p["metadata"]["name"] in plan.delete:
            p = set_deleting(p, t)
        out.append(p)
    names = {p["metadata"]["name"] for p in out}
    for c in plan.create:
        if c["metadata"]["name"] not in names:
            out.append({**copy.deepcopy(c), "status": {"phase": "Pending"}})
    job = {**job, "status": copy.deepcopy(plan.status)}
    return job, out


def by_name(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in pods}


def start(job: dict[str, Any], t: float = 0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Create the pods of attempt 0 and record them."""
    plan = reconcile(job, [], at(t))
    return apply(job, [], plan, t)


def step(
    job: dict[str, Any], pods: list[dict[str, Any]], t: float
) -> tuple[Plan, dict[str, Any], list[dict[str, Any]]]:
    plan = reconcile(job, pods, at(t))
    job2, pods2 = apply(job, pods, plan, t)
    return plan, job2, pods2


def drop_terminating(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]
