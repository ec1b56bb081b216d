"""A failure recorded long before its pod ended (issue 45): a worker that raised and was slow
to exit, in a pod whose agent ended only when a peer's later failure closed the rendezvous. Its
report says when it was written, so the operator places the failure by its age on the node's
own clock, whatever that clock's offset, and names it, not the later failure it caused."""

from __future__ import annotations

import pytest
from dtj_factory import T0, make_job, set_running, set_terminated, start, step
from reports import failure, report
from torchrun_operator.reconcile.core import SETTLE_SECONDS
from torchrun_operator.reconcile.failure.settle import MAX_REPORT_AGE

HOUR = 3600.0


def _epoch(seconds: float) -> float:
    return T0.timestamp() + seconds


@pytest.mark.parametrize("skew", [0.0, HOUR, -HOUR])
@pytest.mark.parametrize(("later", "seen_after"), [("exception", 4.0), ("signal", 9.0)])
def test_a_failure_reported_late_is_placed_by_its_age_and_named(
    skew: float, later: str, seen_after: float
) -> None:
    """Pod 0's rank 1 raises at 20 (its node's clock `skew` off) and is slow to exit; pod 1's
    rank 2 fails at 21 (an exception of its own, or SIGKILL) and its pod ends at once. Pod 0's
    agent ends only then, and its pod is seen `seen_after` seconds after pod 1's. Clamped near
    when it was seen, rank 1's failure would come after rank 2's (or outside the window an
    exception wins in); placed by its age, it is first."""
    job, pods = start(make_job(nodes=2, failurePolicy={"maxRestarts": 0, "backoffSeconds": 0}))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 5)
    second = failure(2, "exception", _epoch(21), "RuntimeError: rank 2 failed later")
    if later == "signal":
        second = failure(2, "signal", _epoch(21), "Signal 9 (SIGKILL)", exit_code=-9)
    msg = report("Failed", [2, 3], [second], group_rank=1, reported_at=_epoch(21.2))
    pods[1] = set_terminated(pods[1], 1, message=msg, t=21)
    _, job, pods = step(job, pods, 22)
    end = 22 + seen_after
    first = failure(
        1, "exception", _epoch(20) + skew, "KeyError: 'rank 1 failed first'", local_rank=1
    )
    msg = report(
        "Failed",
        [0, 1],
        [first],
        group_rank=0,
        message="RendezvousClosedError: the rendezvous was closed",
        reported_at=_epoch(end - 0.5) + skew,
    )
    pods[0] = set_terminated(pods[0], 1, message=msg, t=end)
    _, job, pods = step(job, pods, end)
    plan, _, _ = step(job, pods, end + SETTLE_SECONDS)
    status = plan.status
    assert status["phase"] == "Failed", status
    assert (status["failure"]["rank"], status["failure"]["kind"]) == (1, "exception")


def test_a_report_cannot_claim_its_failure_older_than_the_bound() -> None:
    """A pod's report may move its failure back by MAX_REPORT_AGE at the most: a failure it
    claims an hour old is placed MAX_REPORT_AGE before its pod was seen, after a failure seen
    earlier than that."""
    job, pods = start(make_job(nodes=2, failurePolicy={"maxRestarts": 0, "backoffSeconds": 0}))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 5)
    early = failure(2, "exception", _epoch(10), "RuntimeError: the real first")
    pods[1] = set_terminated(
        pods[1], 1, message=report("Failed", [2, 3], [early], group_rank=1), t=10
    )
    _, job, pods = step(job, pods, 10)
    late = 10 + MAX_REPORT_AGE + 20
    claim = failure(1, "exception", _epoch(late) - HOUR, "KeyError: claims to be first")
    msg = report("Failed", [0, 1], [claim], group_rank=0, reported_at=_epoch(late))
    pods[0] = set_terminated(pods[0], 1, message=msg, t=late)
    plan, _, _ = step(job, pods, late)
    assert plan.status["failure"]["rank"] == 2, plan.status["failure"]
