import copy
import json
from typing import Any

import pytest
from dtj_factory import (
    apply,
    at,
    by_name,
    drop_terminating,
    failure,
    iso,
    make_job,
    set_deleting,
    set_running,
    set_terminated,
    start,
    step,
)
from jobs import condition as cond
from reports import report
from torchrun_operator.api.models import JobStatus
from torchrun_operator.reconcile import reconcile
from torchrun_operator.reconcile.core import MAX_REQUEUE_SECONDS, SETTLE_SECONDS
from torchrun_operator.reconcile.failure.settle import COLLECTIVE_SETTLE_SECONDS


def reasons(plan: Any) -> list[str]:
    return [e.reason for e in plan.events]


def test_fresh_job_creates_every_node_rank_and_is_starting() -> None:
    job = make_job(nodes=3)
    plan = reconcile(job, [], at(0))
    assert [p["metadata"]["name"] for p in plan.create] == ["job-0", "job-1", "job-2"]
    assert plan.status["phase"] == "Starting"
    assert plan.status["attempt"] == 0
    assert plan.status["worldSize"] == 6
    assert plan.status["nodes"]["summary"] == "0/3"
    assert [r["phase"] for r in plan.status["ranks"]] == ["Creating"] * 3
    assert cond(plan.status, "Created")["status"] == "True"
    assert reasons(plan) == ["PodsCreated"]
    JobStatus.model_validate(plan.status)


def test_happy_path_running_rendezvous_succeeded() -> None:
    job, pods = start(make_job())
    pods = [set_running(p) for p in pods]
    plan, job, pods = step(job, pods, 2)
    assert plan.status["phase"] == "Running"
    assert cond(plan.status, "RendezvousDone")["status"] == "False"
    pods = [set_running(p, ready=True) for p in pods]
    plan, job, pods = step(job, pods, 3)
    assert reasons(plan) == ["RendezvousDone"]
    assert plan.status["nodes"]["summary"] == "2/2"
    assert plan.status["ranks"][1]["node"] == "n1"
    # rank 1's launcher holds global ranks 0-1 (c10d ordered it first)
    pods = [
        set_terminated(pods[0], 0, report("Succeeded", [2, 3])),
        set_terminated(pods[1], 0, report("Succeeded", [0, 1])),
    ]
    plan, job, pods = step(job, pods, 20)
    assert plan.status["phase"] == "Succeeded"
    assert plan.status["completionTime"]
    assert [r["globalRanks"] for r in plan.status["ranks"]] == ["2-3", "0-1"]
    assert cond(plan.status, "Succeeded")["status"] == "True"
    assert reasons(plan) == ["Succeeded"]
    # KeepFailed (default): succeeded pods are cleaned up
    assert sorted(plan.delete) == ["job-0", "job-1"]
    JobStatus.model_validate(plan.status)


def test_partial_running_is_starting() -> None:
    job, pods = start(make_job())
    plan, _, _ = step(job, [set_running(pods[0]), pods[1]], 2)
    assert plan.status["phase"] == "Starting"
    assert plan.create == []


def test_rank_zero_success_deletes_the_rest() -> None:
    job, pods = start(make_job(successPolicy="RankZero", runPolicy={"cleanPodPolicy": "KeepAll"}))
    pods = [
        set_terminated(pods[0], 0, report("Succeeded", [0, 1])),
        set_running(pods[1], ready=True),
    ]
    plan, _, _ = step(job, pods, 30)
    assert plan.status["phase"] == "Succeeded"
    assert plan.delete == ["job-1"]


def test_all_ranks_waits_for_every_pod() -> None:
    job, pods = start(make_job())
    pods = [
        set_terminated(pods[0], 0, report("Succeeded", [0, 1])),
        set_running(pods[1], ready=True),
    ]
    plan, _, _ = step(job, pods, 30)
    assert plan.status["phase"] == "Running"
    assert plan.delete == []


def test_user_exception_fails_without_restart_and_names_root_cause() -> None:
    job, pods = start(make_job(nodes=2))
    # node 0 saw the peer close first (its clock), node 1's rank 3 raised 2 s later: within
    # the window the exception wins.
    pods = [
        set_terminated(
            pods[0],
            1,
            report("Failed", [0, 1], [failure(1, "comm", 10, "Connection closed by peer")]),
            t=11,
        ),
        set_terminated(
            pods[1],
            1,
            report(
                "Failed",
                [2, 3],
                [failure(3, "exception", 12, "RuntimeError: boom")],
                group_rank=1,
            ),
            t=12,
        ),
    ]
    plan, _, _ = step(job, pods, 13)
    st = plan.status
    assert st["phase"] == "Failed"
    assert st["failure"]["rank"] == 3 and st["failure"]["index"] == 1
    assert st["failure"]["nodeRank"] == 1
    assert st["failure"]["pod"] == "job-1" and st["failure"]["message"] == "RuntimeError: boom"
    assert st["counters"]["userFailures"] == 1 and st["counters"]["restarts"] == 0
    assert plan.create == []
    assert "RankFailed" in reasons(plan) and "Failed" in reasons(plan)
    assert st["ranks"][1]["message"] == "RuntimeError: boom"
    assert st["ranks"][1]["reason"] == "Exception"
    assert st["ranks"][0]["reason"] == "CommunicationError"
    assert st["ranks"][1]["exitCode"] == 1
    # KeepFailed: failed pods stay
    assert plan.delete == []
    JobStatus.model_validate(st)


def test_a_users_exception_says_where_it_was_raised() -> None:
    """status.failure.location, the message's exception line, the RankFailed event and the
    Failed condition name the frame of the user's code the launcher reported."""
    job, pods = start(make_job(nodes=2))
    where = "/workspace/train.py:9 in <module>"
    error = "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2"
    raised = failure(3, "exception", 12, error)
    raised["location"] = where
    pods = [
        set_terminated(
            pods[0],
            1,
            report("Failed", [0, 1], [failure(1, "comm", 12.5, "Connection closed by peer")]),
            t=13,
        ),
        set_terminated(pods[1], 1, report("Failed", [2, 3], [raised], group_rank=1), t=12),
    ]
    plan, _, _ = step(job, pods, 13)
    st = plan.status
    assert st["failure"]["rank"] == 3
    assert st["failure"]["location"] == where
    assert st["failure"]["message"] == f"{error} (at {where})"
    (event,) = [e for e in plan.events if e.reason == "RankFailed"]
    assert event.type == "Warning" and f"{error} (at {where})" in event.message
    assert f"(at {where})" in cond(st, "Failed")["message"]
    JobStatus.model_validate(st)


def test_a_long_exception_line_is_shortened_so_the_place_survives() -> None:
    job, pods = start(make_job(nodes=1))
    where = "/workspace/" + "pkg/" * 50 + "train.py:9 in main"
    error = "ValueError: " + "x" * 500 + "\nsecond line"
    raised = failure(0, "exception", 12, error)
    raised["location"] = where
    pods = [set_terminated(pods[0], 1, report("Failed", [0], [raised], group_rank=0), t=12)]
    plan, _, _ = step(job, pods, 13)
    st = plan.status
    first = st["failure"]["message"].splitlines()[0]
    assert first.startswith("ValueError: xxx") and first.endswith(f"... (at {where})")
    (event,) = [e for e in plan.events if e.reason == "RankFailed"]
    assert f"(at {where})" in event.message


def test_a_collective_that_did_not_complete_keeps_location_for_the_absent_rank() -> None:
    """A rank that gave up waiting in a collective raised where it waited: that says nothing of
    the cause, and status.failure.location is the rank outside the collective's (none here)."""
    job, pods = start(make_job(nodes=1))
    error = "RuntimeError: [../gloo/transport/tcp/pair.cc:561] Connection closed by peer"
    waited = failure(0, "comm", 12, error)
    waited["location"] = "/workspace/train.py:40 in step"
    pods = [set_terminated(pods[0], 1, report("Failed", [0], [waited], group_rank=0), t=12)]
    plan, _, _ = step(job, pods, 60)
    st = plan.status
    assert "location" not in st["failure"] and "(at " not in st["failure"]["message"]


@pytest.mark.parametrize(
    ("message", "exit_code", "reason", "pod_reason", "expect"),
    [
        (None, 1, None, None, "Failed"),  # bare exit 1, no launcher report: user error
        ("not json{", 2, None, None, "Failed"),  # garbled report falls back to exit code
        (None, 137, "OOMKilled", None, "Restarting"),
        (None, 143, None, None, "Restarting"),  # signal
        (None, 1, None, "Evicted", "Restarting"),
        (
            report("Failed", [0, 1], [failure(0, "signal", 10, exit_code=-9)]),
            1,
            None,
            None,
            "Restarting",
        ),
        (report("RendezvousTimeout"), 1, None, None, "Failed"),
        (report("DNSTimeout"), 1, None, None, "Failed"),
    ],
)
def test_failure_classification(
    message: str | None, exit_code: int, reason: str | None, pod_reason: str | None, expect: str
) -> None:
    job, pods = start(make_job(nodes=1))
    pods = [set_terminated(pods[0], exit_code, message, reason=reason, pod_reason=pod_reason)]
    plan, _, _ = step(job, pods, 30)
    assert plan.status["phase"] == expect
    if expect == "Failed":
        assert plan.create == [] and plan.status["completionTime"]


def test_rendezvous_timeout_reason() -> None:
    job, pods = start(make_job(nodes=1))
    plan, _, _ = step(job, [set_terminated(pods[0], 1, report("DNSTimeout"))], 30)
    assert plan.status["failure"]["reason"] == "DNSTimeout"
    assert cond(plan.status, "Failed")["reason"] == "DNSTimeout"


def test_retryable_exit_code_restarts() -> None:
    job, pods = start(make_job(nodes=1, failurePolicy={"retryableExitCodes": [42]}))
    plan, _, _ = step(job, [set_terminated(pods[0], 42)], 30)
    assert plan.status["phase"] == "Restarting"


def test_a_worker_the_oom_killer_took_is_oomkilled_in_status_and_root_cause() -> None:
    """On a real kubelet the launcher (PID 1) outlives its worker that the OOM killer took:
    torchrun reports a SIGKILL, the container exits 1, and the runtime says OOMKilled."""
    job, pods = start(make_job(nodes=1, failurePolicy={"maxRestarts": 0}))
    report = {
        "v": 1,
        "state": "Failed",
        "groupRank": 0,
        "ranks": [0],
        "failures": [
            {"rank": 0, "exitCode": -9, "kind": "signal", "error": "Signal 9 (SIGKILL) received"}
        ],
    }
    dead = set_terminated(pods[0], 1, message=json.dumps(report), reason="OOMKilled", t=10)
    plan, _, _ = step(job, [dead], 30)
    st = plan.status
    assert st["phase"] == "Failed"
    assert st["failure"]["reason"] == "OOMKilled", st["failure"]
    assert st["ranks"][0]["reason"] == "OOMKilled", st["ranks"]
    # The same report without the runtime's OOMKilled stays a signal.
    plain = set_terminated(pods[0], 1, message=json.dumps(report), t=10)
    plan, _, _ = step(job, [plain], 30)
    assert plan.status["failure"]["reason"] == "Signal"


def test_gang_restart_full_cycle_with_backoff() -> None:
    job, pods = start(make_job(nodes=2, failurePolicy={"maxRestarts": 2, "backoffSeconds": 10}))
    pods = [
        set_terminated(pods[0], 137, reason="OOMKilled", t=10),
        set_running(pods[1], ready=True),
    ]
    # Seen at 11: the other pod may still report the real cause, so the operator waits
    # SETTLE_SECONDS on its own clock.
    plan, job, pods = step(job, pods, 11)
    assert plan.status["phase"] != "Restarting" and plan.delete == []
    assert plan.requeue_after == pytest.approx(SETTLE_SECONDS)
    plan, job, pods = step(job, pods, 21)
    st = plan.status
    assert st["phase"] == "Restarting" and st["attempt"] == 1
    assert sorted(plan.delete) == ["job-0", "job-1"]
    assert st["counters"] == {"userFailures": 0, "infrastructureFailures": 1, "restarts": 1}
    assert st["restarts"][-1]["kind"] == "infrastructure" and st["restarts"][-1]["index"] == 0
    assert st["failure"]["reason"] == "OOMKilled"
    assert plan.requeue_after == 10
    assert "Restarting" in reasons(plan)
    # old pods still terminating: nothing is created (same hostnames)
    plan, job, pods = step(job, pods, 22)
    assert plan.create == [] and plan.events == [] and plan.delete == []
    # pods gone but back-off not over
    pods = drop_terminating(pods)
    plan, job, pods = step(job, pods, 26)
    assert plan.create == [] and plan.requeue_after == pytest.approx(5)
    plan, job, pods = step(job, pods, 31)
    assert [p["metadata"]["name"] for p in plan.create] == ["job-0-a1", "job-1-a1"]
    assert plan.status["phase"] == "Starting"
    args = plan.create[0]["spec"]["containers"][0]["args"]
    assert args[args.index("--rdzv-id") + 1] == "uid-1-1"
    assert cond(plan.status, "Restarting")["status"] == "False"


def test_restart_budget_exhausted_fails() -> None:
    status = {
        "phase": "Running",
        "attempt": 0,
        "counters": {"userFailures": 0, "infrastructureFailures": 0, "restarts": 1},
    }
    job, pods = start(make_job(nodes=1, failurePolicy={"maxRestarts": 1}))
    job["status"]["counters"] = status["counters"]
    plan, _, _ = step(job, [set_terminated(pods[0], 137, reason="OOMKilled")], 30)
    assert plan.status["phase"] == "Failed"
    assert cond(plan.status, "Failed")["reason"] == "RestartBudgetExhausted"
    assert "maxRestarts (1)" in cond(plan.status, "Failed")["message"]


def test_backoff_grows_and_is_capped() -> None:
    job, pods = start(
        make_job(
            nodes=1, failurePolicy={"maxRestarts": 9, "backoffSeconds": 10, "maxBackoffSeconds": 25}
        )
    )
    delays = []
    t = 30.0
    for _ in range(3):
        pods = [set_terminated(p, 137, reason="OOMKilled", t=t - 1) for p in pods]
        plan, job, pods = step(job, pods, t)
        delays.append(plan.requeue_after)
        pods = []
        t += 100
        plan, job, pods = step(job, pods, t)
        assert plan.create
        t += 1
    assert delays == [10, 20, 25]


def test_infrastructure_failure_waits_for_other_reports() -> None:
    job, pods = start(make_job(nodes=2))
    killed = failure(0, "signal", 10, "Signal 9 (SIGKILL) received", exit_code=-9)
    pods = [
        set_terminated(pods[0], 1, report("Failed", [0, 1], [killed]), t=10),
        set_running(pods[1], ready=True),
    ]
    plan, job2, _ = step(job, pods, 11)
    assert plan.status["phase"] in ("Starting", "Running")
    assert plan.requeue_after == pytest.approx(SETTLE_SECONDS)  # from when it was seen
    assert plan.events == []
    # the exception arrives inside the window: user error, no restart
    pods[1] = set_terminated(
        pods[1], 1, report("Failed", [2, 3], [failure(2, "exception", 12, "ValueError: x")]), t=12
    )
    plan, _, _ = step(job2, pods, 13)
    assert plan.status["phase"] == "Failed"
    assert plan.status["failure"]["rank"] == 2


GLOO = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv"


def test_a_collective_timeout_waits_longer_for_the_launcher_that_names_the_absent_rank() -> None:
    """Seen on the local cluster under load: rank 1 times out in an all-reduce that rank 0,
    asleep, never joined. Rank 0's launcher hears of it only when torch's store client gives
    up reconnecting to the pod that ended (about 10 s, more on a busy node), past the usual
    settle window: the operator waits COLLECTIVE_SETTLE_SECONDS for it, and names rank 0."""
    job, pods = start(make_job(nodes=2, failurePolicy={"maxRestarts": 0}))
    timed_out = report("Failed", [1], [failure(1, "comm", 10, GLOO)], group_rank=1)
    pods = [set_terminated(pods[0], 1, timed_out, t=10), set_running(pods[1], ready=True)]
    plan, job2, _ = step(job, pods, 11)
    assert plan.status["phase"] in ("Starting", "Running") and plan.delete == []
    assert plan.requeue_after == pytest.approx(COLLECTIVE_SETTLE_SECONDS)
    # Past the usual window the operator still waits for the pod that runs.
    plan, _, _ = step(job2, pods, 11 + SETTLE_SECONDS + 5)
    assert plan.status["phase"] in ("Starting", "Running") and plan.delete == []
    stacks = [{"rank": 0, "localRank": 0, "inCollective": False, "at": "/w/t.py:60 in main"}]
    late = json.loads(report("Failed", [0], message=STORE_LOST))
    late["stacks"] = stacks
    pods[1] = set_terminated(pods[1], 1, json.dumps(late), t=28)
    plan, _, _ = step(job2, pods, 28.5)
    f = plan.status["failure"]
    assert (f["rank"], f["index"], f["kind"]) == (0, 1, "gloo-timeout"), f
    assert f["location"] == "/w/t.py:60 in main"
    assert plan.status["phase"] == "Failed"


def test_a_collective_timeout_nobody_explains_is_acted_on_after_the_longer_wait() -> None:
    job, pods = start(make_job(nodes=2, failurePolicy={"maxRestarts": 1}))
    timed_out = report("Failed", [1], [failure(1, "comm", 10, GLOO)], group_rank=1)
    pods = [set_terminated(pods[0], 1, timed_out, t=10), set_running(pods[1], ready=True)]
    _, job2, _ = step(job, pods, 11)
    plan, _, _ = step(job2, pods, 11 + COLLECTIVE_SETTLE_SECONDS)
    assert plan.status["phase"] == "Restarting"
    f = plan.status["failure"]
    assert (f["rank"], f["kind"]) == (1, "gloo-timeout"), f


STORE_LOST = "RendezvousConnectionError: The connection to the C10d store has failed."


def test_a_store_connection_loss_waits_for_the_store_hosts_exception() -> None:
    # Seen on the real cluster: rank 3 raises on the pod hosting the c10d store; the other
    # pod's agent dies first, of a lost store connection, with exit code 1 and no failures.
    job, pods = start(make_job(nodes=2))
    lost_store = report("Failed", [0, 1], [], message=STORE_LOST)
    pods = [set_running(pods[0], ready=True), set_terminated(pods[1], 1, lost_store, t=10)]
    plan, job2, _ = step(job, pods, 11)
    assert plan.status["phase"] in ("Starting", "Running") and plan.delete == []
    pods[0] = set_terminated(
        pods[0],
        1,
        report("Failed", [2, 3], [failure(3, "exception", 9.5, "RuntimeError: rank 3")]),
        t=12,
    )
    plan, _, _ = step(job2, pods, 12.5)
    assert plan.status["phase"] == "Failed"
    assert plan.status["failure"]["rank"] == 3
    assert "rank 3" in plan.status["failure"]["message"]


def test_a_lone_store_connection_loss_is_an_infrastructure_failure() -> None:
    job, pods = start(make_job(nodes=1, failurePolicy={"maxRestarts": 1}))
    lost_store = report("Failed", [0, 1], [], message=STORE_LOST)
    plan, _, _ = step(job, [set_terminated(pods[0], 1, lost_store, t=10)], 11)
    assert plan.status["phase"] == "Restarting"


def test_earliest_failure_wins_outside_window() -> None:
    job, pods = start(make_job(nodes=2, failurePolicy={"maxRestarts": 0}))
    pods = [
        set_terminated(
            pods[0], 1, report("Failed", [0, 1], [failure(1, "signal", 10, exit_code=-9)]), t=10
        ),
        set_running(pods[1], ready=True),
    ]
    _, job, pods = step(job, pods, 10)  # the signal is seen as it happens
    pods[1] = set_terminated(
        pods[1], 1, report("Failed", [2, 3], [failure(2, "exception", 30, "late")]), t=30
    )
    plan, _, _ = step(job, pods, 30)
    assert plan.status["failure"]["rank"] == 1
    assert cond(plan.status, "Failed")["reason"] == "RestartBudgetExhausted"


def test_pod_deleted_by_someone_else_is_infrastructure_failure() -> None:
    job, pods = start(make_job(nodes=2))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 2)
    # pod vanished entirely
    plan, _, _ = step(job, [pods[0]], 40)
    assert plan.status["phase"] == "Restarting"
    assert plan.status["failure"]["reason"] == "PodDeleted"
    # pod being deleted (terminating)
    plan, _, _ = step(job, [pods[0], set_deleting(pods[1], 39)], 40)
    assert plan.status["phase"] == "Restarting"


def test_planned_but_unseen_pod_is_recreated_not_failed() -> None:
    job, pods = start(make_job(nodes=2))
    plan, _, _ = step(job, pods[:1], 1)  # cache lag: job-1 not observed yet
    assert [p["metadata"]["name"] for p in plan.create] == ["job-1"]
    assert plan.status["phase"] == "Starting" and plan.events == []


def test_foreign_pod_with_same_name_blocks_create() -> None:
    job = make_job(nodes=1)
    stale = set_running(
        {
            "metadata": {
                "name": "job-0",
                "labels": {},
                "ownerReferences": [{"uid": "old", "controller": True}],
            },
            "spec": {},
        }
    )
    plan = reconcile(job, [stale], at(0))
    # Not ours: never created over, never deleted; the job waits and says why.
    assert plan.create == [] and plan.delete == []
    assert plan.status["phase"] == "Pending" and "ranks" not in plan.status
    blocked = cond(plan.status, "Blocked")
    assert blocked["status"] == "True" and "job-0" in blocked["message"]


def test_elastic_replaces_only_the_lost_pod() -> None:
    job, pods = start(make_job(nodes=3, elastic={"minNodes": 2}))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 2)
    pods[2] = set_terminated(pods[2], 137, reason="OOMKilled")
    plan, job, pods = step(job, pods, 20)
    assert [p["metadata"]["name"] for p in plan.create] == ["job-2-a0r1"]
    assert plan.create[0]["spec"]["hostname"] == "job-2"
    assert plan.delete == []
    assert plan.status["phase"] in ("Running", "Starting") and plan.status["attempt"] == 0
    assert plan.status["counters"]["restarts"] == 1
    assert plan.status["restarts"][-1]["kind"] == "replacement"
    assert reasons(plan) == ["PodReplaced"]
    # reconciling again: the replacement is pending, nothing more happens
    plan, _, _ = step(job, pods, 21)
    assert plan.create == [] and plan.events == []


def test_elastic_below_min_or_losing_store_host_gang_restarts() -> None:
    job, pods = start(make_job(nodes=3, elastic={"minNodes": 3, "maxNodes": 4}))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 2)
    pods = [pods[0], pods[1], set_terminated(pods[2], 137, reason="OOMKilled")]
    _, job, pods = step(job, pods, 20)
    plan, _, _ = step(job, pods, 20 + SETTLE_SECONDS)
    assert plan.status["phase"] == "Restarting"
    job, pods = start(make_job(nodes=3, elastic={"minNodes": 1}))
    pods = [set_running(p, ready=True) for p in pods]
    pods = [set_terminated(pods[0], 137, reason="OOMKilled"), pods[1], pods[2]]
    _, job, pods = step(job, pods, 20)
    plan, _, _ = step(job, pods, 20 + SETTLE_SECONDS)
    assert plan.status["phase"] == "Restarting"


def test_suspend_and_resume_without_spending_budget() -> None:
    job, pods = start(make_job(nodes=2))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 2)
    job["spec"]["runPolicy"] = {"suspend": True}
    plan, job, pods = step(job, pods, 3)
    assert plan.status["phase"] == "Suspended"
    assert sorted(plan.delete) == ["job-0", "job-1"]
    assert reasons(plan) == ["Suspended"]
    plan, job, pods = step(job, pods, 4)
    assert plan.events == [] and plan.delete == []
    job["spec"]["runPolicy"] = {"suspend": False}
    plan, job, pods = step(job, pods, 5)
    assert plan.status["attempt"] == 1 and plan.create == []  # old pods still terminating
    assert reasons(plan) == ["Resumed"]
    plan, job, pods = step(job, drop_terminating(pods), 6)
    assert [p["metadata"]["name"] for p in plan.create] == ["job-0-a1", "job-1-a1"]
    assert plan.status["counters"]["restarts"] == 0
    assert cond(plan.status, "Suspended")["status"] == "False"


def test_created_suspended_then_resumed_starts_attempt_zero() -> None:
    job = make_job(runPolicy={"suspend": True})
    plan = reconcile(job, [], at(0))
    assert plan.status["phase"] == "Suspended" and plan.create == []
    job = {**job, "status": plan.status, "spec": {**job["spec"], "runPolicy": {"suspend": False}}}
    plan = reconcile(job, [], at(1))
    assert [p["metadata"]["name"] for p in plan.create] == ["job-0", "job-1"]


def test_active_deadline() -> None:
    job, pods = start(make_job(runPolicy={"activeDeadlineSeconds": 100}))
    pods = [set_running(p) for p in pods]
    plan, job, pods = step(job, pods, 40)
    assert plan.requeue_after == pytest.approx(60)
    plan, _, _ = step(job, pods, 100)
    assert plan.status["phase"] == "Failed"
    assert cond(plan.status, "Failed")["reason"] == "DeadlineExceeded"
    assert sorted(plan.delete) == ["job-0", "job-1"]


@pytest.mark.parametrize(
    ("policy", "deleted"),
    [("KeepFailed", ["job-1"]), ("KeepAll", []), ("Delete", ["job-0", "job-1"])],
)
def test_clean_pod_policy_after_failure(policy: str, deleted: list[str]) -> None:
    job, pods = start(make_job(runPolicy={"cleanPodPolicy": policy}))
    pods = [
        set_terminated(pods[0], 1, report("Failed", [0, 1], [failure(0, "exception", 9, "E")])),
        set_running(pods[1]),
    ]
    _, job, pods = step(job, pods, 20)  # seen; the running pod may still report
    plan, _, _ = step(job, pods, 20 + SETTLE_SECONDS)
    assert plan.status["phase"] == "Failed"
    assert sorted(plan.delete) == deleted


def test_ttl_after_finished() -> None:
    job, pods = start(make_job(nodes=1, runPolicy={"ttlSecondsAfterFinished": 60}))
    plan, job, pods = step(job, [set_terminated(pods[0], 0, report("Succeeded", [0, 1]))], 20)
    assert plan.requeue_after == pytest.approx(60) and not plan.delete_job
    plan, _, _ = step(job, drop_terminating(pods), 50)
    assert plan.requeue_after == pytest.approx(30) and plan.events == []
    plan, _, _ = step(job, [], 81)
    assert plan.delete_job


def test_restart_history_keeps_last_ten() -> None:
    job, pods = start(make_job(nodes=1, failurePolicy={"maxRestarts": 20, "backoffSeconds": 0}))
    t = 10.0
    for _ in range(12):
        plan, job, pods = step(job, [set_terminated(p, 143) for p in pods], t)
        plan, job, pods = step(job, [], t + 1)
        t += 10
    assert len(job["status"]["restarts"]) == 10
    assert job["status"]["restarts"][-1]["attempt"] == 12
    assert job["status"]["counters"]["restarts"] == 12


def test_invalid_spec_fails_job() -> None:
    job = make_job()
    job["spec"]["nodes"] = 0
    plan = reconcile(job, [], at(0))
    assert plan.status["phase"] == "Failed" and plan.create == []
    assert cond(plan.status, "Failed")["reason"] == "InvalidSpec"


def test_pending_reason_surfaces_in_rank() -> None:
    job, pods = start(make_job(nodes=1))
    pods[0]["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes",
            }
        ],
    }
    plan, _, _ = step(job, pods, 1)
    assert plan.status["ranks"][0]["reason"] == "Unschedulable"


def test_apply_helper_marks_deletes() -> None:
    job, pods = start(make_job(nodes=1))
    plan = reconcile({**job, "spec": {**job["spec"], "runPolicy": {"suspend": True}}}, pods, at(1))
    _, pods2 = apply(job, pods, plan, 1)
    assert by_name(pods2)["job-0"]["metadata"]["deletionTimestamp"]


def test_requeue_delay_is_bounded_for_any_deadline() -> None:
    """A long activeDeadlineSeconds becomes many bounded wake-ups, never one huge timer."""
    job = make_job(runPolicy={"activeDeadlineSeconds": 10**7})
    plan = reconcile(job, [], at(0))
    assert plan.requeue_after is not None and 0 < plan.requeue_after <= MAX_REQUEUE_SECONDS


@pytest.mark.parametrize("culprit_skew", [0.0, -30.0, 3600.0])
@pytest.mark.parametrize("peer_skew", [0.0, -30.0, 3600.0])
def test_node_clock_skew_changes_neither_root_cause_nor_timing(
    culprit_skew: float, peer_skew: float
) -> None:
    """Rank 3 raises at t=10 on one node; the other node's agent dies of the lost connection
    half a second later. Whatever either node's clock says, the exception is the root cause,
    and the job fails when the operator has seen both (never earlier, never an hour later)."""
    job, pods = start(make_job(nodes=2, failurePolicy={"maxRestarts": 0}))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 2)
    comm = report("Failed", [0, 1], [failure(0, "comm", 10.5 + peer_skew, "Connection closed")])
    pods[0] = set_terminated(pods[0], 1, comm, t=10.5 + peer_skew)
    plan, job, pods = step(job, pods, 11)  # the lost connection is seen first
    assert plan.status["phase"] == "Running", "waits for the other node's report"
    # (a lost connection names no rank outside a collective yet: the longer wait)
    assert plan.requeue_after == pytest.approx(COLLECTIVE_SETTLE_SECONDS)
    boom = report("Failed", [2, 3], [failure(3, "exception", 10 + culprit_skew, "ValueError: x")])
    pods[1] = set_terminated(pods[1], 1, boom, t=10 + culprit_skew)
    plan, _, _ = step(job, pods, 12)
    assert plan.status["phase"] == "Failed"
    assert plan.status["failure"]["rank"] == 3 and plan.status["failure"]["reason"] == "Exception"


def test_a_node_an_hour_ahead_cannot_postpone_the_decision() -> None:
    job, pods = start(make_job(nodes=2))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 2)
    pods[0] = set_terminated(pods[0], 137, reason="OOMKilled", t=10 + 3600)
    plan, job, pods = step(job, pods, 11)
    assert plan.requeue_after == pytest.approx(SETTLE_SECONDS)
    plan, _, _ = step(job, pods, 11 + SETTLE_SECONDS)
    assert plan.status["phase"] == "Restarting"
    # Recorded on the operator's clock, not an hour in the future.
    assert plan.status["failure"]["at"] <= iso(12)


def test_a_replaced_pod_that_comes_back_is_deleted_not_run_beside_its_replacement() -> None:
    """Issue 45: an elastic replacement has the hostname and rendezvous id of the pod it
    replaced. A pod lost with its node (phase Unknown: the kubelet stopped reporting) is
    replaced; when that kubelet returns, the old pod is Running again beside its replacement,
    answering the same DNS name. The status already names the replacement, so the old pod
    goes whenever it is seen, lost or back, and is not taken for a failure of its index."""
    job, pods = start(make_job(nodes=3, elastic={"minNodes": 2}))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 2)
    lost = copy.deepcopy(pods[2])
    lost["status"]["phase"] = "Unknown"
    pods[2] = lost
    plan, job, pods = step(job, pods, 20)
    assert [p["metadata"]["name"] for p in plan.create] == ["job-2-a0r1"]
    assert plan.status["ranks"][2]["pod"] == "job-2-a0r1"
    # The old pod, lost still: it goes (its node may never delete it by itself).
    plan, job, pods = step(job, pods, 21)
    assert "job-2" in plan.delete
    # Its kubelet is back before the delete was carried out: Running beside its replacement.
    back = by_name(pods)["job-2"]
    back = set_running({**back, "metadata": {**back["metadata"], "deletionTimestamp": None}})
    pods = [back if p["metadata"]["name"] == "job-2" else p for p in pods]
    plan, job, pods = step(job, pods, 22)
    assert "job-2" in plan.delete
    assert plan.status["ranks"][2]["pod"] == "job-2-a0r1"
    assert plan.status["counters"]["restarts"] == 1  # not a second failure of index 2
    assert plan.create == []
