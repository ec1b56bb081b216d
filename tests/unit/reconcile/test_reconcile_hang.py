"""Failures no launcher reports: absent node ranks, hung rendezvous, stalled progress."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from dtj_factory import at, by_name, iso, make_job, set_running, set_terminated, start, step
from jobs import condition as cond
from reports import report
from torchrun_operator.api.models import JobStatus
from torchrun_operator.reconcile import hang
from torchrun_operator.reconcile.observe import view


def unschedulable(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient cpu.",
            }
        ],
    }
    return pod


def running(pod: dict[str, Any], ready: bool, t: float = 1, since: float | None = None) -> dict:
    pod = set_running(pod, ready=ready, t=t)
    pod["status"]["conditions"][0]["lastTransitionTime"] = iso(t if since is None else since)
    return pod


RDZV_TIMEOUT = report("RendezvousTimeout", message="rendezvous did not complete in time")


# ---- a launcher-reported rendezvous timeout names who never arrived -------------------------


def test_rendezvous_timeout_names_the_unschedulable_node_rank() -> None:
    job, pods = start(make_job(nodes=3, rendezvous={"joinTimeoutSeconds": 20}))
    pods = [running(pods[0], False), running(pods[1], False), unschedulable(pods[2])]
    plan, job, pods = step(job, pods, 2)
    assert plan.status["phase"] == "Waiting"  # the scheduler said the pod does not fit
    pods = [
        set_terminated(pods[0], 1, RDZV_TIMEOUT, t=22),
        set_terminated(pods[1], 1, RDZV_TIMEOUT, t=22),
        pods[2],
    ]
    # Decided at once: waiting would let pod 2 start in the room the others freed.
    plan, job, pods = step(job, pods, 23)
    status = plan.status
    assert status["phase"] == "Failed"
    failure = status["failure"]
    assert failure["reason"] == "RendezvousTimeout"
    assert (failure["index"], failure["pod"]) == (2, "job-2")
    assert "pod job-2 (index 2) never started (Pending: Unschedulable" in failure["message"]
    assert "Insufficient cpu" in failure["message"]
    assert "pods job-0, job-1 waited joinTimeoutSeconds (20s)" in failure["message"]
    assert "job-2" in cond(status, "Failed")["message"]
    JobStatus.model_validate(status)


def test_a_launcher_that_started_later_is_still_waiting_not_absent() -> None:
    job, pods = start(make_job(nodes=3, rendezvous={"joinTimeoutSeconds": 20}))
    pods = [
        set_terminated(pods[0], 1, RDZV_TIMEOUT, t=21),
        running(pods[1], False, t=8),  # its own join timeout runs until about 28
        unschedulable(pods[2]),
    ]
    plan, _, _ = step(job, pods, 22)
    failure = plan.status["failure"]
    assert failure["index"] == 2
    assert "job-1" not in failure["message"].split(";")[0]
    assert "pods job-0, job-1 waited" in failure["message"]


def test_a_pending_pod_bound_in_the_room_the_others_freed_still_never_started() -> None:
    job, pods = start(make_job(nodes=3, rendezvous={"joinTimeoutSeconds": 20}))
    pods = [running(pods[0], False), running(pods[1], False), unschedulable(pods[2])]
    _, job, pods = step(job, pods, 2)  # the operator sees pod 2 Pending
    # The others give up and exit; the scheduler binds pod 2 in the room they freed, and it
    # is Running by the time the operator looks.
    pods = [
        set_terminated(pods[0], 1, RDZV_TIMEOUT, t=22),
        set_terminated(pods[1], 1, RDZV_TIMEOUT, t=22),
        running(pods[2], False, t=22),
    ]
    plan, _, _ = step(job, pods, 22)
    failure = plan.status["failure"]
    assert (failure["reason"], failure["index"]) == ("RendezvousTimeout", 2)
    assert failure["pod"] == "job-2"
    late = "pod job-2 (index 2) never started in time (Pending until the others gave up waiting)"
    message = failure["message"]
    assert late in message, message
    assert "pods job-0, job-1 waited joinTimeoutSeconds (20s)" in message


def test_a_pod_that_lost_the_store_host_had_joined() -> None:
    lost = report("Failed", message="RendezvousConnectionError: connection to the C10d store")
    job, pods = start(make_job(nodes=3))
    pods = [
        set_terminated(pods[0], 1, RDZV_TIMEOUT, t=20),
        set_terminated(pods[1], 1, lost, t=21),
        unschedulable(pods[2]),
    ]
    plan, _, _ = step(job, pods, 22)
    assert plan.status["failure"]["index"] == 2
    assert "pods job-0, job-1 waited" in plan.status["failure"]["message"]


def test_rendezvous_timeout_names_a_running_pod_whose_launcher_never_joined() -> None:
    job, pods = start(make_job(nodes=3))
    _, job, pods = step(job, [running(p, False) for p in pods], 1)  # seen Running at 1
    pods = [
        set_terminated(pods[0], 1, RDZV_TIMEOUT, t=20),
        pods[1],
        set_terminated(pods[2], 1, RDZV_TIMEOUT, t=20),
    ]
    plan, _, _ = step(job, pods, 1 + 600 + hang.STALL_GRACE_SECONDS)
    failure = plan.status["failure"]
    assert failure["index"] == 1
    assert "pod job-1 (index 1) is Running but never joined" in failure["message"]
    assert "job-0" not in failure["message"].split(";")[0]
    assert "pods job-0, job-2 waited" in failure["message"]


def test_dns_timeout_keeps_the_reporting_pod_as_cause() -> None:
    job, pods = start(make_job(nodes=1))
    plan, _, _ = step(job, [set_terminated(pods[0], 1, report("DNSTimeout", message="no"))], 30)
    assert plan.status["failure"]["index"] == 0
    assert plan.status["failure"]["message"] == "no"


# ---- a rendezvous that hangs with no report -------------------------------------------------


def test_hung_rendezvous_with_every_launcher_silent_fails_after_timeout_and_margin() -> None:
    job, pods = start(make_job(nodes=2, rendezvous={"joinTimeoutSeconds": 20}))
    pods = [running(pods[0], False, t=3), pods[1]]
    _, job, pods = step(job, pods, 3)
    pods = [pods[0], running(pods[1], False, t=5)]
    _, job, pods = step(job, pods, 5)  # the operator sees the last pod Running at 5
    limit = 5 + 20 + hang.RENDEZVOUS_MARGIN_SECONDS
    plan, job, pods = step(job, pods, 10)
    assert plan.status["phase"] == "Running"
    assert plan.requeue_after == pytest.approx(limit - 10)
    plan, job2, _ = step(job, pods, limit - 1)
    assert plan.status["phase"] == "Running"
    plan, _, _ = step(job2, pods, limit)
    status = plan.status
    assert status["phase"] == "Failed"
    assert cond(status, "Failed")["reason"] == "RendezvousTimeout"
    failure = status["failure"]
    assert failure["kind"] == "rendezvous" and failure["index"] == 0
    assert "no launcher reported" in failure["message"]
    assert "pod job-0 (index 0) is Running but never joined" in failure["message"]
    assert "pod job-1 (index 1)" in failure["message"]
    assert status["counters"]["userFailures"] == 1
    assert sorted(plan.delete) == ["job-0", "job-1"]  # KeepFailed: Running pods go


def test_hung_rendezvous_names_only_the_pods_that_are_not_ready() -> None:
    # Elastic: pod 0 trains in a round of minNodes without pod 1, whose launcher never joined.
    # (Without elastic bounds a Ready pod means a round of every pod: a quiet one then is a
    # stall, test_reconcile_live.)
    job, pods = start(make_job(nodes=2, elastic={"minNodes": 1}))
    pods = [running(pods[0], True), running(pods[1], False)]
    _, job, pods = step(job, pods, 1)
    plan, _, _ = step(job, pods, 1 + 600 + hang.RENDEZVOUS_MARGIN_SECONDS)
    assert plan.status["failure"]["index"] == 1
    assert "job-0" not in plan.status["failure"]["message"]


def test_a_pod_that_never_starts_fails_the_rendezvous_on_the_timer() -> None:
    # Seen on the real cluster: pod 0 (the store host) unschedulable, the others waiting for
    # its DNS name and reporting nothing within joinTimeoutSeconds.
    job, pods = start(make_job(nodes=2))
    plan, job, _ = step(job, [pods[0], running(pods[1], False)], 100)
    assert plan.status["phase"] == "Starting" and plan.requeue_after is not None
    plan, _, _ = step(job, [pods[0], running(pods[1], False)], 5000)
    assert plan.status["phase"] == "Failed"
    failure = plan.status["failure"]
    assert failure["reason"] == "RendezvousTimeout" and failure["index"] == 0
    assert "pod job-0 (index 0)" in failure["message"] and "never started" in failure["message"]


def test_no_hang_timer_before_any_pod_runs_or_after_rendezvous() -> None:
    job, pods = start(make_job(nodes=2))
    plan, _, _ = step(job, pods, 5000)
    assert plan.status["phase"] in ("Pending", "Starting") and "failure" not in plan.status
    ready = [running(p, True) for p in pods]
    plan, job, _ = step(job, ready, 2)
    assert cond(plan.status, "RendezvousDone")["status"] == "True"
    plan, _, _ = step(job, [running(p, False, since=100) for p in pods], 5000)
    assert plan.status["phase"] == "Running"  # no progressTimeoutSeconds: not judged


# ---- progress stalls ------------------------------------------------------------------------


def training(spec: dict[str, Any], nodes: int = 2) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    job, pods = start(make_job(nodes=nodes, **spec))
    pods = [running(p, True, t=1) for p in pods]
    plan, job, pods = step(job, pods, 5)
    assert cond(plan.status, "RendezvousDone")["status"] == "True"
    return job, pods


PROGRESS = {"runPolicy": {"progressTimeoutSeconds": 60}, "failurePolicy": {"backoffSeconds": 0}}


def test_a_pod_that_goes_quiet_after_rendezvous_is_a_stall_and_restarts_the_gang() -> None:
    job, pods = training(PROGRESS)
    pods = [pods[0], running(pods[1], False, since=100)]
    _, job, _ = step(job, pods, 100)  # the operator sees it NotReady at 100
    plan, job2, _ = step(job, pods, 100 + hang.STALL_GRACE_SECONDS - 1)
    assert plan.status["phase"] == "Running"
    assert plan.requeue_after == pytest.approx(1)
    plan, _, _ = step(job2, pods, 100 + hang.STALL_GRACE_SECONDS)
    status = plan.status
    assert status["phase"] == "Restarting" and status["attempt"] == 1
    failure = status["failure"]
    assert (failure["reason"], failure["kind"]) == ("ProgressStalled", "stalled")
    assert (failure["index"], failure["pod"]) == (1, "job-1")
    assert "pod job-1 reported no training progress" in failure["message"]
    assert "progressTimeoutSeconds (60s)" in failure["message"]
    assert status["restarts"][-1]["kind"] == "infrastructure"
    assert status["restarts"][-1]["reason"] == "ProgressStalled"
    assert status["counters"]["infrastructureFailures"] == 1
    assert sorted(plan.delete) == ["job-0", "job-1"]
    JobStatus.model_validate(status)


def test_stall_with_spent_budget_fails_naming_every_quiet_rank() -> None:
    job, pods = training({**PROGRESS, "failurePolicy": {"maxRestarts": 0}}, nodes=3)
    quiet = [pods[0], pods[1], running(pods[2], False, since=48)]
    _, job, _ = step(job, quiet, 48)
    pods = [running(pods[0], False, since=50), pods[1], quiet[2]]
    _, job, _ = step(job, pods, 50)
    plan, _, _ = step(job, pods, 70)
    status = plan.status
    assert status["phase"] == "Failed"
    assert cond(status, "Failed")["reason"] == "RestartBudgetExhausted"
    assert status["failure"]["reason"] == "ProgressStalled"
    assert status["failure"]["index"] == 2  # went quiet first
    assert "pods job-2, job-0 reported no training progress" in status["failure"]["message"]
    assert [r.get("reason") for r in status["ranks"]] == [
        "ProgressStalled",
        None,
        "ProgressStalled",
    ]


def test_a_pod_that_joined_after_rendezvous_is_not_judged_by_progress() -> None:
    spec = {**PROGRESS, "elastic": {"minNodes": 1}}
    job, pods = training(spec)
    plan, job, pods = step(job, [pods[0], set_terminated(pods[1], 137, reason="OOMKilled")], 20)
    assert [p["metadata"]["name"] for p in plan.create] == ["job-1-a0r1"]
    late = running(by_name(pods)["job-1-a0r1"], False, t=200)
    _, job, _ = step(job, [pods[0], late], 200)  # first seen Running after the rendezvous
    plan, _, _ = step(job, [pods[0], late], 300)
    assert plan.status["phase"] == "Running"
    assert plan.status["failure"]["reason"] == "OOMKilled"  # the replaced pod's, no stall


# ---- the pure pieces ------------------------------------------------------------------------


def pod_view(**status: Any) -> Any:
    return view({"metadata": {"name": "p"}, "spec": {}, "status": status}, "trainer")


@pytest.mark.parametrize(
    ("status", "why"),
    [
        ({"phase": "Pending"}, "never started (Pending)"),
        ({"phase": "Running"}, "is Running but never joined"),  # never seen Running: stuck
        ({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}, None),
        ({"phase": "Succeeded"}, None),
        ({"phase": "Failed", "reason": "Evicted"}, "failed before it joined (Evicted)"),
    ],
)
def test_absent_reason(status: dict[str, Any], why: str | None) -> None:
    got = hang.absent_reason(pod_view(**status), hang.Watched(), at(0).timestamp(), 600)
    assert (got is None) if why is None else (got is not None and got[1].startswith(why))


def test_a_running_pod_is_waiting_until_its_join_timeout_then_stuck() -> None:
    pod = pod_view(
        phase="Running",
        containerStatuses=[{"name": "trainer", "state": {"running": {"startedAt": iso(0)}}}],
    )
    seen = hang.Watched(running=at(0).timestamp())
    limit = 20 + hang.STALL_GRACE_SECONDS
    assert hang.absent_reason(pod, seen, at(limit - 1).timestamp(), 20) is None
    got = hang.absent_reason(pod, seen, at(limit).timestamp(), 20)
    assert got is not None and got[1].startswith("is Running but never joined")


def test_a_pod_running_only_since_the_others_gave_up_never_started_in_time() -> None:
    pod, now = pod_view(phase="Running"), at(30).timestamp()
    seen = hang.Watched(running=now)  # seen Running only now: its own join timeout runs
    assert hang.absent_reason(pod, seen, now, 20) is None
    got = hang.absent_reason(pod, seen, now, 20, started_now=True)
    assert got == (0, "never started in time (Pending until the others gave up waiting)")


def test_started_now_is_pending_before_and_running_now_for_the_same_pod() -> None:
    pod = view({"metadata": {"name": "p"}, "spec": {}, "status": {"phase": "Running"}}, "trainer")
    assert hang.started_now(pod, {"pod": "p", "phase": "Pending"})
    assert not hang.started_now(pod, {"pod": "p", "phase": "Running"})
    assert not hang.started_now(pod, {"pod": "p-a1", "phase": "Pending"})  # another pod's
    assert not hang.started_now(pod, {})  # a restarted operator's first look


def test_absent_reason_of_a_pod_never_created_or_that_waited() -> None:
    assert hang.absent_reason(None, hang.Watched(), 0, 1) == (0, "was never created")
    waited = {
        "phase": "Failed",
        "containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": RDZV_TIMEOUT}}}
        ],
    }
    assert hang.absent_reason(pod_view(**waited), hang.Watched(), 0, 1) is None


def test_stalled_waits_for_the_grace_period() -> None:
    q = [hang.Quiet(0, "p", None, at(10).timestamp())]
    due, wait = hang.stalled(q, at(12).timestamp())
    assert due == [] and wait == pytest.approx(hang.STALL_GRACE_SECONDS - 2)
    due, wait = hang.stalled(q, at(10 + hang.STALL_GRACE_SECONDS).timestamp())
    assert due == q and wait is None
