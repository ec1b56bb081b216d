"""A checkpoint a pod reports must lie in the job's checkpoint storage (spec.checkpoint's
mountPath): its path becomes status.lastCheckpoint and every later pod's
TORCHRUN_OPERATOR_RESUME_FROM. A path outside it, or climbing with `..`, refuses the answer or
report it came in (said once, as any refused pod input), never reaches the status, and so
never reaches a pod."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dtj_factory import UID, at, make_job, set_running, set_terminated, start
from jobs import condition as cond
from torchrun_operator.reconcile import reconcile

MOUNT = "/ckpt"
RESUME = "TORCHRUN_OPERATOR_RESUME_FROM"
OUTSIDE = ["/etc/shadow", "/ckpt/../etc/shadow", "/ckpt/a/../b.pt", "step-5.pt", "/ckptx/5.pt"]


def running() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    job = make_job(
        nodes=2,
        failurePolicy={"maxRestarts": 1, "backoffSeconds": 0},
        checkpoint={"claimName": "c", "mountPath": MOUNT},
    )
    job, pods = start(job)
    for i, p in enumerate(pods):
        p["metadata"]["uid"] = f"pod-{i}"
    return job, [set_running(p, ready=True) for p in pods]


def answer(index: int, path: str, step: int = 5) -> dict[str, Any]:
    progress = {"step": step, "checkpoint": {"step": step, "path": path}}
    data = {"v": 1, "rdzvId": f"{UID}-0", "index": index, "state": "Training", "groupRank": index}
    return {"at": at(5).timestamp(), "data": {**data, "progress": progress}}


def report(path: str, step: int = 5) -> str:
    """A launcher stopped by its pod's eviction: SIGTERM, no worker failure, its checkpoint."""
    fields = {"v": 1, "state": "Failed", "groupRank": 0, "ranks": [0, 1], "restarts": 0}
    stopped = {"failures": [], "message": "the agent got SIGTERM"}
    return json.dumps({**fields, **stopped, "checkpoint": {"step": step, "path": path}})


def next_attempt(
    job: dict[str, Any], pods: list[dict[str, Any]], message: str | None = None
) -> tuple[dict[str, Any], list[str | None]]:
    """Pod 0 evicted (its termination message `message`), the gang restarted: the status
    that decided it, and what each pod of the next attempt is told to resume from."""
    ended = [
        set_terminated(pods[0], 137, message, t=10, pod_reason="Evicted"),
        set_terminated(pods[1], 0, t=10),
    ]
    plan = reconcile(job, ended, at(20))
    assert plan.status["phase"] == "Restarting", plan.status.get("failure")
    created = reconcile({**job, "status": plan.status}, [], at(30)).create
    assert len(created) == 2
    told = [
        next(
            (e.get("value") for e in p["spec"]["containers"][0]["env"] if e["name"] == RESUME), None
        )
        for p in created
    ]
    return plan.status, told


@pytest.mark.parametrize("path", OUTSIDE)
def test_a_live_answer_with_a_checkpoint_outside_the_mount_is_refused(path: str) -> None:
    job, pods = running()
    live = {"pod-0": answer(0, path, step=50), "pod-1": answer(1, "/ckpt/step-5.a0", step=5)}
    plan = reconcile(job, pods, at(6), live=live)
    assert plan.status["phase"] == "Running"
    # The other pod's checkpoint, in the storage, is the job's; the refused one is not,
    # though its step is higher.
    assert plan.status["lastCheckpoint"]["path"] == "/ckpt/step-5.a0"
    said = cond(plan.status, "PodInputRejected")
    assert said is not None and "pod job-0: its status answer: checkpoint path" in said["message"]
    assert "job-1" not in said["message"]
    assert [e.reason for e in plan.events].count("PodAnswerRejected") == 1
    # The refused answer tells nothing else either: pod 0's node rank stays unknown.
    assert "nodeRank" not in plan.status["ranks"][0] and plan.status["ranks"][1]["nodeRank"] == 1
    # The next attempt resumes from the checkpoint in the storage.
    _, told = next_attempt({**job, "status": plan.status}, pods)
    assert told == ["/ckpt/step-5.a0"] * 2


@pytest.mark.parametrize("path", OUTSIDE)
def test_a_report_with_a_checkpoint_outside_the_mount_is_refused_and_never_resumed(
    path: str,
) -> None:
    job, pods = running()
    status, told = next_attempt(job, pods, report(path))
    assert "lastCheckpoint" not in status
    said = cond(status, "PodInputRejected")
    assert said is not None and "pod job-0: its report: checkpoint path" in said["message"]
    assert told == [None, None]


def test_a_checkpoint_in_the_mount_is_resumed_from() -> None:
    # Paths in the storage pass, however spelled: the refusal is about the place alone.
    job, pods = running()
    good = "/ckpt//./step-5.a0/"
    status, told = next_attempt(job, pods, report(good))
    assert status["lastCheckpoint"]["path"] == good
    assert cond(status, "PodInputRejected") is None
    assert told == [good, good]
