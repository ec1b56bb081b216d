"""Nothing a pod says may hurt the operator (issue 24 §2), at the reconciler: a job whose pods
all ended finishes from their exits whatever they reported, every status it writes is one the
apiserver takes (no integer past int64, no NaN), what was refused is said once, and per-rank
strings from pods stay within the status budget."""

from __future__ import annotations

import json
import math
from typing import Any

from dtj_factory import UID, at, make_job, set_running, set_terminated, start
from jobs import condition as cond
from torchrun_operator.api.models import JobStatus
from torchrun_operator.reconcile import budget, progress, reconcile
from torchrun_operator.reconcile.observe import Live

INT64 = 2**63 - 1
SENTINEL = 18446744073709551615  # 2**64 - 1, a common "unknown" step


def writable(status: dict[str, Any]) -> None:
    """What the apiserver would take: strict JSON, every integer within int64."""
    text = json.dumps(status, allow_nan=False)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, int) and not isinstance(node, bool):
            assert -INT64 - 1 <= node <= INT64, node

    walk(json.loads(text))
    JobStatus.model_validate(status)


def summary(state: str = "Succeeded", **fields: Any) -> str:
    base = {"v": 1, "state": state, "groupRank": 0, "ranks": [0], "restarts": 0, "failures": []}
    return json.dumps({**base, **fields})


def running(nodes: int = 2) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    job, pods = start(make_job(nodes=nodes, failurePolicy={"maxRestarts": 0}))
    for i, p in enumerate(pods):
        p["metadata"]["uid"] = f"pod-{i}"
    return job, [set_running(p, ready=True) for p in pods]


def test_pods_that_exit_0_with_a_sentinel_step_finish_the_job_succeeded() -> None:
    # Seen: a progress file holding 2**64 - 1 put that step into both reports; every status
    # write was answered 422 and the job stayed Running for good.
    job, pods = running()
    ended = [set_terminated(p, 0, summary(step=SENTINEL), t=10) for p in pods]
    plan = reconcile(job, ended, at(20))
    assert plan.status["phase"] == "Succeeded"
    writable(plan.status)
    said = cond(plan.status, "PodInputRejected")
    assert said is not None and said["reason"] == "PodAnswerRejected"
    assert "pod job-0: its report: step 18446744073709551615" in said["message"]
    rejected = [e for e in plan.events if e.reason == "PodAnswerRejected"]
    assert len(rejected) == 2 and all(e.type == "Warning" for e in rejected)
    # Said once: the next reconcile of the same pods says nothing new.
    again = reconcile({**job, "status": plan.status}, ended, at(30))
    assert not [e for e in again.events if e.reason == "PodAnswerRejected"]
    assert cond(again.status, "PodInputRejected") == said


def test_a_report_with_a_nan_failure_time_still_fails_the_job_on_its_exit_code() -> None:
    job, pods = running()
    nan = summary(
        "Failed", failures=[{"rank": 0, "localRank": 0, "exitCode": 1, "kind": "exception"}]
    ).replace('"kind": "exception"', '"kind": "exception", "at": NaN')
    assert "NaN" in nan
    ended = [set_terminated(pods[0], 1, nan, t=10), set_terminated(pods[1], 0, summary(), t=11)]
    plan = reconcile(job, ended, at(20))
    assert plan.status["phase"] == "Failed"
    assert plan.status["failure"]["pod"] == "job-0"
    assert plan.status["failure"]["exitCode"] == 1
    writable(plan.status)


def test_a_report_state_never_becomes_an_unbounded_rank_reason() -> None:
    job, pods = running()
    ended = [
        set_terminated(pods[0], 1, summary("x" * 3000), t=10),
        set_terminated(pods[1], 0, summary(), t=10),
    ]
    plan = reconcile(job, ended, at(20))
    assert plan.status["phase"] == "Failed"
    assert all(len(r.get("reason", "")) <= budget.MAX_REASON for r in plan.status["ranks"])
    writable(plan.status)


def test_hostile_live_answers_are_said_once_and_leave_the_status_writable() -> None:
    job, pods = running()
    hostile = {
        "at": at(5).timestamp(),
        "data": None,
        "rejected": "progress.step 18446744073709551615 is out of range 0..9007199254740992",
    }
    good = {
        "at": at(5).timestamp(),
        "data": {"v": 1, "rdzvId": f"{UID}-0", "index": 1, "state": "Training", "groupRank": 0},
    }
    live = {"pod-0": hostile, "pod-1": good}
    plan = reconcile(job, pods, at(6), live=live)
    assert plan.status["phase"] == "Running"
    assert plan.status["ranks"][1]["nodeRank"] == 0 and "nodeRank" not in plan.status["ranks"][0]
    said = cond(plan.status, "PodInputRejected")
    assert said is not None and "pod job-0: its status answer: progress.step" in said["message"]
    assert [e.reason for e in plan.events].count("PodAnswerRejected") == 1
    again = reconcile({**job, "status": plan.status}, pods, at(7), live=live)
    assert [e.reason for e in again.events].count("PodAnswerRejected") == 0
    writable(again.status)


def test_global_ranks_and_reasons_from_pods_are_bounded_at_any_job_size() -> None:
    # Below 512 ranks the budget did not measure: 100 entries of 20 KB each passed whole.
    status: dict[str, Any] = {
        "ranks": [
            {"index": i, "pod": f"p{i}", "reason": "R" * 20_000, "globalRanks": "1," * 10_000}
            for i in range(100)
        ]
    }
    bounded = budget.bound(status)
    assert budget.size(bounded) < budget.STATUS_BUDGET_BYTES
    assert all("globalRanks" not in r for r in bounded["ranks"])
    assert all(len(r["reason"]) == budget.MAX_REASON for r in bounded["ranks"])


def test_job_progress_takes_no_number_past_its_range() -> None:
    # A total of 10**400 raised OverflowError; a total from an older status is checked too.
    entries = [{"index": 0, "step": 5, "stepsPerSecond": 1.0, "lastStepAt": "2026-01-01T00:00:00Z"}]
    live = {0: Live(at=1.0, total=10**400)}
    out = progress.job_progress(entries, live, {"totalSteps": 10**400})
    assert out is not None and "totalSteps" not in out
    assert progress.job_progress([{"index": 0, "step": SENTINEL}], {}, None) is None
    assert progress.job_progress([{"index": 0, "step": 1, "stepsPerSecond": math.nan}], {}, None)
