"""Crash loops end early: an attempt that fails like the one before it without getting further
fails the job as CrashLoopNoProgress instead of spending the rest of maxRestarts."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from dtj_factory import (
    apply,
    at,
    drop_terminating,
    failure,
    make_job,
    set_running,
    set_terminated,
    start,
    step,
)
from jobs import condition as cond
from reports import report
from torchrun_operator.api.models import JobStatus
from torchrun_operator.launcher import contract
from torchrun_operator.reconcile import crashloop, reconcile
from torchrun_operator.reconcile.rootcause import Candidate

POLICY = {"maxRestarts": 5, "backoffSeconds": 0}
KILLED = "Signal 9 (SIGKILL) received by PID {pid}"


def fail_attempt(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    t: float,
    step_reached: int | None,
    rank: int = 3,
    error: str | None = None,
    kind: contract.FailureKind = "signal",
    exit_code: int = -9,
    checkpoint: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every pod of the current attempt fails: `rank` died (a signal by default), the other
    pod lost its peer; both report the step they reached (and `checkpoint`, the last one their
    script saved). Returns the job after the decision and the pods of the next attempt, if one
    started."""
    attempt = job["status"]["attempt"]
    current = [p for p in pods if p["metadata"]["labels"]["torchrun.dev/attempt"] == str(attempt)]
    error = error or KILLED.format(pid=1000 + rank + 17 * attempt)
    holder = 1 if rank >= 2 else 0
    failed = []
    for i, pod in enumerate(current):
        ranks = [2 * i, 2 * i + 1]
        if i == holder:
            body = report(
                "Failed",
                ranks,
                [failure(rank, kind, t, error, exit_code)],
                group_rank=i,
                step=step_reached,
                checkpoint=checkpoint,
            )
        else:
            peer = failure(ranks[0], "comm", t + 0.5, "Connection reset by peer")
            body = report(
                "Failed", ranks, [peer], group_rank=i, step=step_reached, checkpoint=checkpoint
            )
        failed.append(set_terminated(pod, 1, body, t=t + 1))
    _, job, pods = step(job, failed, t + 2)
    if job["status"]["phase"] == "Restarting":
        _, job, pods = step(job, drop_terminating(pods), t + 3)
    return job, pods


def first_attempt(**spec: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    job, pods = start(make_job(nodes=2, failurePolicy={**POLICY, **spec}))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 2)
    return job, pods


def test_same_failure_at_or_before_the_previous_step_is_a_crash_loop() -> None:
    job, pods = first_attempt()
    job, pods = fail_attempt(job, pods, 10, step_reached=120, rank=3)
    st = job["status"]
    assert st["phase"] == "Starting" and st["attempt"] == 1
    record = st["restarts"][-1]
    assert record["step"] == 120 and record["index"] == 1 and record["nodeRank"] == 1
    assert record["signature"] == "signal/Signal/-9: Signal N (SIGKILL) received by PID N"
    # Attempt 1 is read at step 118 while it runs, then dies the same way on another rank
    # (another pid), no further: at step 118, the first step the operator saw of it (no
    # progress past its start).
    job, pods = runs(job, pods, 20, (118,))
    assert job["status"]["progress"]["startStep"] == 118
    job, _ = fail_attempt(job, pods, 40, step_reached=118, rank=1)
    st = job["status"]
    assert st["phase"] == "Failed"
    failed = cond(st, "Failed")
    assert failed is not None and failed["reason"] == "CrashLoopNoProgress"
    assert (
        "attempt 1 failed at step 118 (the first step seen of it), no further than attempt 0 "
        "(step 120)" in failed["message"]
    )
    assert "failurePolicy.crashLoopDetection" in failed["message"]
    assert st["failure"]["step"] == 118 and st["failure"]["rank"] == 1
    assert st["counters"]["restarts"] == 1 and st["counters"]["infrastructureFailures"] == 2
    JobStatus.model_validate(st)


def test_a_restart_that_got_further_restarts_again() -> None:
    job, pods = first_attempt()
    job, pods = fail_attempt(job, pods, 10, step_reached=120)
    job, pods = fail_attempt(job, pods, 40, step_reached=121)
    st = job["status"]
    assert st["attempt"] == 2 and st["phase"] == "Starting"
    assert [r["step"] for r in st["restarts"]] == [120, 121]
    # ... and the next one is judged against 121.
    job, _ = fail_attempt(job, pods, 80, step_reached=121)
    assert cond(job["status"], "Failed")["reason"] == "CrashLoopNoProgress"


def test_another_error_is_not_a_crash_loop() -> None:
    job, pods = first_attempt(retryableExitCodes=[1])
    job, pods = fail_attempt(job, pods, 10, step_reached=50)
    job, _ = fail_attempt(
        job, pods, 40, step_reached=50, kind="exception", exit_code=1, error="OSError: disk"
    )
    assert job["status"]["phase"] == "Starting" and job["status"]["attempt"] == 2


def test_crash_loop_detection_can_be_turned_off() -> None:
    job, pods = first_attempt(crashLoopDetection=False)
    job, pods = fail_attempt(job, pods, 10, step_reached=50)
    job, _ = fail_attempt(job, pods, 40, step_reached=20)
    assert job["status"]["phase"] == "Starting" and job["status"]["attempt"] == 2


def test_without_any_step_progress_is_unknown_and_restarts_go_on() -> None:
    job, pods = first_attempt()
    job, pods = fail_attempt(job, pods, 10, step_reached=None)
    job, _ = fail_attempt(job, pods, 40, step_reached=None)
    st = job["status"]
    assert st["phase"] == "Starting" and st["attempt"] == 2
    assert "step" not in st["restarts"][-1]


def test_no_step_after_an_attempt_that_had_steps_is_no_progress() -> None:
    job, pods = first_attempt()
    job, pods = fail_attempt(job, pods, 10, step_reached=7)
    job, _ = fail_attempt(job, pods, 40, step_reached=None)
    failed = cond(job["status"], "Failed")
    assert failed is not None and failed["reason"] == "CrashLoopNoProgress"
    assert "failed before its first step" in failed["message"]


def test_with_the_budget_spent_a_crash_loop_still_says_so() -> None:
    job, pods = first_attempt(maxRestarts=1)
    job, pods = fail_attempt(job, pods, 10, step_reached=5)
    job, _ = fail_attempt(job, pods, 40, step_reached=5)
    assert cond(job["status"], "Failed")["reason"] == "CrashLoopNoProgress"


def test_lost_pods_are_never_a_crash_loop() -> None:
    job, pods = first_attempt()
    for t in (10, 40):
        attempt = job["status"]["attempt"]
        current = [
            p for p in pods if p["metadata"]["labels"]["torchrun.dev/attempt"] == str(attempt)
        ]
        running = [set_running(p, ready=True) for p in current]
        _, job, pods = step(job, running, t)
        # pod 1 vanishes (deleted by someone, its node gone): PodDeleted
        _, job, pods = step(job, [running[0]], t + 1)
        assert job["status"]["phase"] == "Restarting"
        assert "signature" not in job["status"]["restarts"][-1]
        _, job, pods = step(job, drop_terminating(pods), t + 2)
    assert job["status"]["attempt"] == 2 and job["status"]["phase"] == "Starting"


# ---- the signature -------------------------------------------------------------------------


def cand(kind: str, reason: str, message: str | None, exit_code: int | None = None) -> Candidate:
    return Candidate(0, "p", None, kind, reason, 0.0, exit_code=exit_code, message=message)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "RuntimeError: CUDA error: an illegal memory access at 0x7f3a2c001200 on rank 3",
            "RuntimeError: CUDA error: an illegal memory access at 0x7f3a2c00ff00 on rank 12",
        ),
        (
            "ValueError: batch 1200 has shape [32, 511]",
            "ValueError: batch 1201 has shape [32, 509]",
        ),
        ("OSError: store 10.1.2.3:29500 gone", "OSError: store 10.1.2.14:41234 gone"),
        (
            "KeyError: 'run-3f9a2b7c11d4'\ntraceback line 1",
            "KeyError: 'run-aa01bb02cc03'\ntraceback line 2",
        ),
    ],
)
def test_signatures_ignore_ranks_numbers_and_addresses(a: str, b: str) -> None:
    assert crashloop.signature(cand("exception", "Exception", a, 1)) == crashloop.signature(
        cand("exception", "Exception", b, -6)
    )


def test_signatures_tell_errors_apart() -> None:
    sig = crashloop.signature
    assert sig(cand("exception", "Exception", "ValueError: x")) != sig(
        cand("exception", "Exception", "KeyError: x")
    )
    assert sig(cand("exit", "NonZeroExit", "m", 3)) != sig(cand("exit", "NonZeroExit", "m", 4))
    assert sig(cand("lost", "PodDeleted", "pod p-1: PodDeleted")) is None
    assert sig(cand("evicted", "Evicted", "x")) is None
    assert sig(cand("oom", "OOMKilled", "pod job-1 ran out", 137)) == "oom/OOMKilled/137"


def test_previous_failure_is_the_record_that_started_this_attempt() -> None:
    records = [
        {"attempt": 1, "kind": "infrastructure", "step": 5, "signature": "s"},
        {"attempt": 2, "kind": "suspend"},
    ]
    assert crashloop.previous_failure(records, 1)["step"] == 5
    assert crashloop.previous_failure(records, 2) == {}  # a resume: nothing to compare
    assert crashloop.previous_failure(records, 0) == {}


@pytest.mark.parametrize(
    ("step", "start", "previous", "none"),
    [
        (5, 0, 5, True),  # failed where the previous attempt did
        (5, None, 5, True),
        (4, 4, 5, True),  # never got past its own start
        (4, None, 5, False),  # no step seen before it failed: where it started is unknown
        (4, 3, 5, False),  # trained past its start, failed short of the previous failure
        (4600, 4000, 5000, False),
        (6, 6, 5, False),  # got further
        (None, None, 5, True),  # its last step is known to be none: before its first step
        (None, None, None, False),
        (3, 0, None, False),
    ],
)
def test_made_no_progress(
    step: int | None, start: int | None, previous: int | None, none: bool
) -> None:
    assert crashloop.made_no_progress(step, start, previous, final=True) is none


@pytest.mark.parametrize(
    ("step", "start", "previous"), [(5, 0, 5), (4, 4, 5), (None, None, 5), (6, 6, 5)]
)
def test_a_last_step_only_an_earlier_read_saw_is_never_no_progress(
    step: int | None, start: int | None, previous: int | None
) -> None:
    """No final report, no stall: the attempt may have gone on after the last read."""
    assert crashloop.made_no_progress(step, start, previous, final=False) is False


def test_the_last_step_is_known_from_a_final_report_or_a_stall() -> None:
    assert crashloop.last_step_known(False, [None, {"state": "Failed"}])
    assert crashloop.last_step_known(True, [None, None])
    assert not crashloop.last_step_known(False, [None, None])


@pytest.mark.parametrize(
    ("before", "step", "failed", "start"),
    [
        (None, 4000, False, 4000),  # the first step seen of the attempt
        ({"step": 4100, "startStep": 4000}, 4600, False, 4000),  # kept
        ({"step": 4100}, 4600, False, 4100),  # written before the field: the step it had
        ({"step": 4100, "startStep": 4000}, 3900, False, 3900),  # went back (in-pod restart)
        # While pods have failed the steps are final reports: never a start.
        (None, 4000, True, None),
        ({"step": 4100}, 4000, True, None),  # that step may be a final report too
        ({"step": 4100, "startStep": 4000}, 3900, True, 4000),
    ],
)
def test_start_step(
    before: dict[str, int] | None, step: int, failed: bool, start: int | None
) -> None:
    assert crashloop.start_step(before, step, failed) == start


# ---- hangs: another cause, or progress since the attempt began --------------------------------


def stall(index: int, node: str, rank: int | None = None, at: str | None = None) -> Candidate:
    return Candidate(
        index, f"job-{index}", node, "stalled", "ProgressStalled", 0.0, rank=rank, location=at
    )


def test_a_hang_signature_names_where_it_hangs() -> None:
    sig = crashloop.signature
    assert sig(stall(1, "n2")) == (
        "stalled/ProgressStalled: index 1 on node n2, every rank in a collective"
    )
    assert sig(stall(1, "n2")) != sig(stall(1, "n3")), "a hang on another node: another cause"
    assert sig(stall(1, "n2")) != sig(stall(0, "n2"))
    at22, at40 = "/w/t.py:22 in load", "/w/t.py:40 in load"
    assert (
        sig(stall(1, "n2", 3, at22))
        == sig(stall(0, "n5", 3, at22))
        == ("stalled/ProgressStalled: rank 3 at /w/t.py:22 in load")
    )
    assert sig(stall(1, "n2", 3, at22)) != sig(stall(1, "n2", 3, at40))
    assert sig(stall(1, "n2", 3, at22)) != sig(stall(1, "n2", 2, at22))


UID = "uid-1"
HANG: dict[str, Any] = {"runPolicy": {"progressTimeoutSeconds": 60}}


def live(pods: list[dict[str, Any]], attempt: int, steps: int, read_at: float) -> dict[str, Any]:
    """What every pod's launcher says when read at `read_at`: its step."""
    out = {}
    for p in pods:
        i = int(p["metadata"]["labels"]["torchrun.dev/index"])
        data = {"v": 1, "index": i, "rdzvId": f"{UID}-{attempt}", "progress": {"step": steps}}
        out[p["metadata"]["uid"]] = {"at": at(read_at).timestamp(), "data": data}
    return out


def hang_at(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    t: float,
    resumed: int,
    reached: int,
    quiet_first: int,
    nodes: tuple[str, str],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The current attempt's pods run on `nodes`, resume from step `resumed` and train to
    `reached`; then pod `quiet_first` goes quiet, the other a moment later, every rank in a
    collective (a communication hang). Returns the job after the decision and the pods."""
    attempt = job["status"]["attempt"]
    current = [p for p in pods if p["metadata"]["labels"]["torchrun.dev/attempt"] == str(attempt)]
    ready = []
    for i, p in enumerate(current):
        p = set_running(p, ready=True, node=nodes[i], t=t)
        p["metadata"]["uid"] = f"pod-{p['metadata']['name']}"
        ready.append(p)
    for dt, steps in ((0, None), (15, resumed), (30, reached)):
        reads = live(ready, attempt, steps, t + dt) if steps is not None else None
        plan = reconcile(job, ready, at(t + dt), live=reads)
        job, ready = apply(job, ready, plan, t + dt)
    reads = live(ready, attempt, reached, t + 30)
    quiet = [copy.deepcopy(p) for p in ready]
    for n, i in enumerate((quiet_first, 1 - quiet_first)):
        quiet[i]["status"]["conditions"][0]["status"] = "False"
        when = t + 100 + n
        plan = reconcile(job, quiet, at(when), live=reads)
        job, quiet = apply(job, quiet, plan, when)
    plan = reconcile(job, quiet, at(t + 120), live=reads)
    job, pods = apply(job, quiet, plan, t + 120)
    if job["status"]["phase"] == "Restarting":
        plan = reconcile(job, drop_terminating(pods), at(t + 121))
        job, pods = apply(job, drop_terminating(pods), plan, t + 121)
    return job, pods


@pytest.mark.parametrize(
    ("second", "loop"),
    [
        # Another flaky node hangs after the restart trained 600 steps from its checkpoint.
        ({"resumed": 4000, "reached": 4600, "quiet_first": 0, "nodes": ("n3", "n4")}, False),
        # The same node hangs again, but the attempt trained past where it resumed.
        ({"resumed": 4000, "reached": 4600, "quiet_first": 1, "nodes": ("n1", "n2")}, False),
        # Another node hangs at the same step: another cause.
        ({"resumed": 4000, "reached": 5000, "quiet_first": 0, "nodes": ("n3", "n4")}, False),
        # The same node hangs at the same step again: a loop.
        ({"resumed": 4000, "reached": 5000, "quiet_first": 1, "nodes": ("n1", "n2")}, True),
        # The same node hangs again before the attempt trained a step: a loop.
        ({"resumed": 4000, "reached": 4000, "quiet_first": 1, "nodes": ("n1", "n2")}, True),
    ],
)
def test_a_hang_after_a_checkpoint_restart_is_a_crash_loop_only_at_the_same_place(
    second: dict[str, Any], loop: bool
) -> None:
    """Attempt 0 trains from step 0 and hangs in NCCL at step 5000, pod 1 (node n2) quiet
    first; attempt 1 resumes from a checkpoint and hangs again."""
    job, pods = start(make_job(nodes=2, failurePolicy=POLICY, **HANG))
    job, pods = hang_at(job, pods, 10, 0, 5000, 1, ("n1", "n2"))
    st = job["status"]
    assert st["attempt"] == 1 and st["phase"] == "Starting"
    assert st["restarts"][-1]["step"] == 5000
    assert st["restarts"][-1]["signature"] == (
        "stalled/ProgressStalled: index 1 on node n2, every rank in a collective"
    )
    job, _ = hang_at(job, pods, 300, **second)
    st = job["status"]
    if loop:
        failed = cond(st, "Failed")
        assert failed is not None and failed["reason"] == "CrashLoopNoProgress"
    else:
        assert st["phase"] == "Starting" and st["attempt"] == 2, cond(st, "Failed")
        assert st["restarts"][-1]["step"] == second["reached"]


# ---- no evidence, no verdict: what no read saw is unknown, never "no progress" ---------------


def read(pods: list[dict[str, Any]], attempt: int, steps: int | None, t: float) -> dict[str, Any]:
    """Every pod's launcher answers at `t`: its step, or (None) no step written yet."""
    out = {}
    for p in pods:
        i = int(p["metadata"]["labels"]["torchrun.dev/index"])
        data: dict[str, Any] = {"v": 1, "index": i, "rdzvId": f"{UID}-{attempt}"}
        if steps is not None:
            data["progress"] = {"step": steps}
        out[p["metadata"]["uid"]] = {"at": at(t).timestamp(), "data": data}
    return out


def runs(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    t: float,
    reads: tuple[int | None, ...] = (),
    nodes: tuple[str, str] = ("n1", "n2"),
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The current attempt's pods run on `nodes`, Ready; the operator reads their launchers
    once per entry of `reads`, 15 s apart (no entries: the status port never answered)."""
    attempt = job["status"]["attempt"]
    current = [p for p in pods if p["metadata"]["labels"]["torchrun.dev/attempt"] == str(attempt)]
    up = []
    for i, p in enumerate(current):
        p = set_running(p, ready=True, node=nodes[i], t=t)
        p["metadata"]["uid"] = f"pod-{p['metadata']['name']}"
        up.append(p)
    plan = reconcile(job, up, at(t))
    job, up = apply(job, up, plan, t)
    for n, steps in enumerate(reads, start=1):
        when = t + 15 * n
        plan = reconcile(job, up, at(when), live=read(up, attempt, steps, when))
        job, up = apply(job, up, plan, when)
    return job, up


def restarted(st: dict[str, Any], attempt: int) -> None:
    assert st["phase"] == "Starting" and st["attempt"] == attempt, cond(st, "Failed")


def test_an_attempt_no_read_saw_whose_reports_show_progress_restarts() -> None:
    """Attempt 0 saves a checkpoint at step 100 and fails at 120. Attempt 1 resumes; its status
    port never answers (unreadable, reads starved); it saves a checkpoint at 110, so it trained
    past where it resumed, and fails the same way at 118. It made progress: restart."""
    job, pods = first_attempt()
    job, pods = fail_attempt(
        job, pods, 10, step_reached=120, checkpoint={"step": 100, "path": "/c/100"}
    )
    job, pods = runs(job, pods, 20)
    job, _ = fail_attempt(
        job, pods, 40, step_reached=118, rank=1, checkpoint={"step": 110, "path": "/c/110"}
    )
    st = job["status"]
    restarted(st, 2)
    assert st["lastCheckpoint"]["step"] == 110
    assert st["restarts"][-1]["step"] == 118


@pytest.mark.parametrize(
    "reads",
    [
        (),  # the status port never answered
        (None, None),  # it answered, before the script wrote its first step
    ],
)
def test_a_start_step_only_the_final_reports_tell_is_unknown(reads: tuple[None, ...]) -> None:
    """No read saw attempt 1 at a step before it failed at 118, short of attempt 0's 120: where
    it started is unknown (a restart resumes from its checkpoint, anywhere behind 120), so
    whether it got past its start is unknown too, and the final reports alone cannot tell (the
    step it failed at is no start). Unknown is not no progress: restart."""
    job, pods = first_attempt()
    job, pods = fail_attempt(job, pods, 10, step_reached=120)
    job, pods = runs(job, pods, 20, reads)
    job, _ = fail_attempt(job, pods, 70, step_reached=118, rank=1)
    st = job["status"]
    restarted(st, 2)
    assert st["restarts"][-1]["step"] == 118


def test_an_attempt_that_ended_without_a_word_is_unknown() -> None:
    """Attempt 0 was seen at step 120 when its launchers were SIGKILLed (no final report).
    Attempt 1 was never read and ends the same way: nothing says where it started or how far
    it got, not even that it reached no step. Unknown: restart."""
    job, pods = first_attempt()
    job, pods = runs(job, pods, 5, (120,))
    killed = [set_terminated(p, 137, None, t=25) for p in pods]
    _, job, pods = step(job, killed, 26)
    _, job, pods = step(job, drop_terminating(pods), 27)
    st = job["status"]
    assert st["attempt"] == 1 and st["restarts"][-1]["step"] == 120
    signature = st["restarts"][-1]["signature"]
    job, pods = runs(job, pods, 30)
    killed = [set_terminated(p, 137, None, t=50) for p in pods]
    _, job, _ = step(job, killed, 51)
    st = job["status"]
    assert st["phase"] == "Restarting" and st["attempt"] == 2, cond(st, "Failed")
    assert st["restarts"][-1]["signature"] == signature  # the same error: only progress differs


# ---- collective timeouts: where they time out --------------------------------------------------

WATCHDOG = (
    "RuntimeError: [Rank {rank}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
    "for 600{rank}07 milliseconds before timing out."
)


def timed_out(index: int, node: str, rank: int = 0, at: str | None = None) -> Candidate:
    message = WATCHDOG.format(rank=rank, seq=7 + index)
    return Candidate(
        index, f"job-{index}", node, "comm", "NCCLTimeout", 0.0, rank=rank, exit_code=-6,
        message=message, says="nccl-timeout", location=at,
    )  # fmt: skip


def test_a_collective_timeout_signature_names_where_it_timed_out() -> None:
    sig = crashloop.signature
    assert (sig(timed_out(1, "n2")) or "").startswith(
        "comm/NCCLTimeout/-6: index 1 on node n2, first to give up: RuntimeError: [Rank N] "
        "Watchdog caught collective operation timeout"
    )
    assert sig(timed_out(1, "n2", rank=2)) == sig(timed_out(1, "n2", rank=3))
    assert sig(timed_out(1, "n2")) != sig(timed_out(1, "n3")), "another node: another cause"
    assert sig(timed_out(1, "n2")) != sig(timed_out(0, "n2"))
    # A launcher found the rank the others waited for: where it was is the site, any node.
    at22 = "/w/t.py:22 in load"
    assert sig(timed_out(1, "n2", 3, at22)) == sig(timed_out(0, "n5", 3, at22))
    assert sig(timed_out(1, "n2", 3, at22)) != sig(timed_out(1, "n2", 3, "/w/t.py:40 in load"))


def time_out(
    job: dict[str, Any], pods: list[dict[str, Any]], t: float, reached: int, first: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every rank's NCCL watchdog times out at step `reached` (every rank waits in the
    collective: a link, not a rank), pod `first`'s first, the other's 3 s later (the operator
    sees each as it happens); the job after the decision and the next attempt's pods."""
    pods = list(pods)
    for n, i in enumerate((first, 1 - first)):
        when = t + 3 * n
        error = WATCHDOG.format(rank=2 * i, seq=reached * 3 + i)
        body = report(
            "Failed", [2 * i, 2 * i + 1], [failure(2 * i, "comm", when, error, -6)], i, step=reached
        )
        pods[i] = set_terminated(pods[i], 1, body, t=when)
        _, job, _ = step(job, pods, when + 1)
    _, job, pods = step(job, pods, t + 5)
    if job["status"]["phase"] == "Restarting":
        _, job, pods = step(job, drop_terminating(pods), t + 6)
    return job, pods


@pytest.mark.parametrize(
    ("second", "loop"),
    [
        # Resumed at 4000, timed out there before training a step, on other nodes: another
        # link, another cause.
        ({"nodes": ("n3", "n4"), "reads": (4000,), "reached": 4000, "first": 0}, False),
        # ... at the very step attempt 0 timed out at, on another node: another cause.
        ({"nodes": ("n3", "n4"), "reads": (4000, 5000), "reached": 5000, "first": 1}, False),
        # The same pod on the same node times out again before a step past its start: a loop.
        ({"nodes": ("n1", "n2"), "reads": (4000,), "reached": 4000, "first": 1}, True),
        # ... or at the same step as before: a loop.
        ({"nodes": ("n1", "n2"), "reads": (4000, 5000), "reached": 5000, "first": 1}, True),
    ],
)
def test_nccl_timeouts_are_a_crash_loop_only_on_the_same_node(
    second: dict[str, Any], loop: bool
) -> None:
    """Attempt 0 trains to step 5000 on n1 and n2, where pod 1's watchdog (node n2) times out
    first; attempt 1 resumes from the step-4000 checkpoint and times out again."""
    job, pods = first_attempt()
    job, pods = runs(job, pods, 5, (0, 5000))
    job, pods = time_out(job, pods, 50, 5000, first=1)
    st = job["status"]
    assert st["attempt"] == 1 and st["restarts"][-1]["step"] == 5000
    assert st["failure"]["reason"] == "NCCLTimeout" and st["failure"]["index"] == 1
    job, pods = runs(job, pods, 100, second["reads"], second["nodes"])
    job, _ = time_out(job, pods, 200, second["reached"], second["first"])
    st = job["status"]
    if loop:
        failed = cond(st, "Failed")
        assert failed is not None and failed["reason"] == "CrashLoopNoProgress"
    else:
        restarted(st, 2)
        assert st["failure"]["index"] == second["first"]
