"""The plan says what the reconciler decided (Plan.transitions), once: the metrics count it."""

from __future__ import annotations

from typing import Any

from dtj_factory import (
    apply,
    at,
    failure,
    iso,
    make_job,
    set_running,
    set_terminated,
    start,
    step,
)
from hypothesis import given, settings
from pod_histories import STEPS, Step, drive, jobs
from reports import report
from torchrun_operator.api.status_names import ConditionType, Phase, RestartKind
from torchrun_operator.reconcile import conditions, reconcile
from torchrun_operator.reconcile.plan import PhaseChanged, Plan, Reached, Restarted


def created(job: dict[str, Any], t: float = 0) -> dict[str, Any]:
    job["metadata"]["creationTimestamp"] = iso(t)
    return job


def restarts(plan: Plan) -> list[RestartKind]:
    return [t.kind for t in plan.transitions if isinstance(t, Restarted)]


def test_a_job_that_starts_and_runs_says_so_once() -> None:
    job = created(make_job(nodes=2))
    first = reconcile(job, [], at(0))
    assert first.transitions == [PhaseChanged(Phase.PENDING, Phase.STARTING)]
    job, pods = apply(job, [], first, 0)
    pods = [set_running(p, ready=True) for p in pods]
    plan, job, pods = step(job, pods, 7)
    assert plan.transitions == [
        PhaseChanged(Phase.STARTING, Phase.RUNNING),
        Reached(ConditionType.RUNNING, 7.0),
        Reached(ConditionType.RENDEZVOUS_DONE, 7.0),
    ]
    # Decided from the status that recorded it, nothing has happened again.
    again, _, _ = step(job, pods, 9)
    assert again.transitions == []


def test_a_gang_restart_is_one_infrastructure_restart_and_times_count_from_it() -> None:
    policy = {"maxRestarts": 2, "backoffSeconds": 0}
    job, pods = start(created(make_job(nodes=2, failurePolicy=policy)))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 5)
    pods[1] = set_terminated(pods[1], 137, reason="OOMKilled", t=20)
    seen, job, pods = step(job, pods, 21)  # the other pod may still report: wait
    assert seen.transitions == []
    plan, job, pods = step(job, pods, 40)  # past the settle window
    assert plan.status["phase"] == "Restarting"
    assert restarts(plan) == [RestartKind.INFRASTRUCTURE]
    assert PhaseChanged(Phase.RUNNING, Phase.RESTARTING) in plan.transitions
    assert plan.status["counters"]["restarts"] == 1
    # The old pods go; the new attempt starts, runs, and its start-up counts from the restart.
    pods = []
    plan, job, pods = step(job, pods, 41)
    assert plan.transitions == [PhaseChanged(Phase.RESTARTING, Phase.STARTING)]
    pods = [set_running(p, ready=True) for p in pods]
    plan, job, pods = step(job, pods, 50)
    assert Reached(ConditionType.RUNNING, 10.0) in plan.transitions


def test_a_user_error_fails_without_a_restart() -> None:
    job, pods = start(make_job(nodes=1))
    failed = report("Failed", [0, 1], [failure(0, "exception", 11.0, "E: x")])
    pods = [set_terminated(pods[0], 1, failed)]
    plan, _, _ = step(job, pods, 12)
    assert plan.status["phase"] == "Failed"
    assert restarts(plan) == []
    assert plan.transitions == [PhaseChanged(Phase.STARTING, Phase.FAILED)]


def test_each_elastic_replacement_is_a_restart() -> None:
    job, pods = start(make_job(nodes=3, elastic={"minNodes": 1, "maxNodes": 3}))
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 5)
    pods[1] = set_terminated(pods[1], 137, reason="OOMKilled", t=20)
    pods[2] = set_terminated(pods[2], 137, reason="OOMKilled", t=20)
    plan, _, _ = step(job, pods, 21)
    assert restarts(plan) == [RestartKind.REPLACEMENT, RestartKind.REPLACEMENT]
    assert plan.status["counters"]["restarts"] == 2


def test_a_blocked_start_decides_nothing() -> None:
    plan = reconcile(make_job(nodes=2), [], at(0), blocked=["Service ns/job is not this job's"])
    assert plan.status["phase"] == "Pending"
    assert plan.transitions == []


def test_an_invalid_spec_fails_the_job() -> None:
    plan = reconcile(make_job(nodes=0), [], at(0))
    assert plan.transitions == [PhaseChanged(Phase.PENDING, Phase.FAILED)]


def _true(status: dict[str, Any], type_: str) -> bool:
    return conditions.is_true(status.get("conditions") or [], type_)


@settings(max_examples=60, deadline=None)
@given(job=jobs(), steps=STEPS)
def test_transitions_are_exactly_what_changed_in_the_status(
    job: dict[str, Any], steps: list[Step]
) -> None:
    """Over random pod histories, what a plan says it decided is what its status shows:
    the phase chain leads from the old phase to the new, one restart per counted restart,
    a start-up milestone exactly when its condition turned True; and nothing twice
    (pod_histories.settled)."""
    for now in drive(created(job), steps):
        old = now.job.get("status") or {}
        plan = now.plan
        new = plan.status
        phases = [c for c in plan.transitions if isinstance(c, PhaseChanged)]
        chain = [old.get("phase") or "Pending", *(c.after for c in phases)]
        assert [c.before for c in phases] == chain[:-1]
        assert chain[-1] == new["phase"]
        spent = new["counters"]["restarts"] - (old.get("counters") or {}).get("restarts", 0)
        assert len(restarts(plan)) == spent
        for type_ in (ConditionType.RUNNING, ConditionType.RENDEZVOUS_DONE):
            turned = _true(new, type_) and not _true(old, type_)
            reached = [r for r in plan.transitions if isinstance(r, Reached)]
            assert [r.condition for r in reached].count(type_) == int(turned)
        # Nothing decided twice: `drive` reconciles the applied plan again (settled) and
        # requires no transitions of it.
