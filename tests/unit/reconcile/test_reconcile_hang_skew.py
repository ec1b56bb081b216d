"""Hang detection on the operator's clock: a node clock that is off by any amount changes
neither whether nor when a rendezvous hang or a progress stall is decided."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from dtj_factory import at, iso, make_job, set_terminated, start, step
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs import condition as cond
from reports import report
from torchrun_operator.reconcile import hang, reconcile
from torchrun_operator.reconcile.observe import view

HOUR = 3600.0
SKEWS = [0.0, HOUR, -HOUR]


def on_node(
    pod: dict[str, Any], phase: str, ready: bool, started: float, since: float, skew: float
) -> dict[str, Any]:
    """`pod` as its kubelet reports it, every time it writes `skew` seconds off (`started`,
    `since`: when it started and its readiness last changed, in true seconds after T0)."""
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeName"] = f"node-{pod['metadata']['labels']['torchrun.dev/index']}"
    if phase == "Pending":
        pod["status"] = {"phase": "Pending"}
        return pod
    pod["status"] = {
        "phase": "Running",
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "lastTransitionTime": iso(since + skew),
            }
        ],
        "containerStatuses": [
            {"name": "trainer", "state": {"running": {"startedAt": iso(started + skew)}}}
        ],
    }
    return pod


RDZV_TIMEOUT = report("RendezvousTimeout", message="rendezvous did not complete in time")


# ---- progressTimeoutSeconds ------------------------------------------------------------------

PROGRESS: dict[str, Any] = {
    "runPolicy": {"progressTimeoutSeconds": 60},
    "failurePolicy": {"backoffSeconds": 0},
}


@pytest.mark.parametrize("skew", SKEWS)
def test_a_stall_on_a_node_an_hour_off_is_decided_after_the_grace_period(skew: float) -> None:
    """Pod 1's node clock is `skew` off. It trains from 5 and goes quiet at 100: the stall is
    decided two probe periods after the operator saw it NotReady, never at once (a clock
    behind) and never an hour later or not at all (a clock ahead)."""
    job, pods = start(make_job(nodes=2, **PROGRESS))
    pods = [on_node(p, "Running", True, 1, 4, skew if i == 1 else 0.0) for i, p in enumerate(pods)]
    plan, job, _ = step(job, pods, 5)
    assert cond(plan.status, "RendezvousDone")["status"] == "True"
    pods[1] = on_node(pods[1], "Running", False, 1, 100, skew)
    plan, job, _ = step(job, pods, 100)
    assert plan.status["phase"] == "Running"
    assert plan.requeue_after == pytest.approx(hang.STALL_GRACE_SECONDS)
    plan, job2, _ = step(job, pods, 100 + hang.STALL_GRACE_SECONDS - 1)
    assert plan.status["phase"] == "Running"
    plan, _, _ = step(job2, pods, 100 + hang.STALL_GRACE_SECONDS)
    status = plan.status
    assert status["phase"] == "Restarting"
    assert (status["failure"]["reason"], status["failure"]["index"]) == ("ProgressStalled", 1)
    assert f"NotReady since {iso(100)}" in status["failure"]["message"]


@pytest.mark.parametrize("skew", SKEWS)
def test_a_restarted_operator_fires_no_false_stall(skew: float) -> None:
    """The operator saw pod 1 NotReady at 100 and restarted: all it knows is the status it
    wrote. The stall is still decided at 100 + grace, from the status, not earlier."""
    job, pods = start(make_job(nodes=2, **PROGRESS))
    pods = [on_node(p, "Running", True, 1, 4, skew) for p in pods]
    _, job, _ = step(job, pods, 5)
    pods[1] = on_node(pods[1], "Running", False, 1, 100, skew)
    _, job, _ = step(job, pods, 100)
    # A fresh operator (no memory but the job's status) a moment later.
    plan = reconcile(copy.deepcopy(job), copy.deepcopy(pods), at(101))
    assert plan.status["phase"] == "Running"
    assert plan.requeue_after == pytest.approx(hang.STALL_GRACE_SECONDS - 1)


# ---- a rendezvous that hangs with no report --------------------------------------------------


@pytest.mark.parametrize("skew", SKEWS)
def test_a_hung_rendezvous_on_a_node_an_hour_off_times_out_on_the_operators_clock(
    skew: float,
) -> None:
    """Every pod Running from 5 (the operator saw it then), none Ready, no report: hung at
    5 + joinTimeoutSeconds + margin, whatever the nodes' clocks say."""
    job, pods = start(make_job(nodes=2, rendezvous={"joinTimeoutSeconds": 20}))
    pods = [on_node(p, "Running", False, 5, 5, skew) for p in pods]
    limit = 5 + 20 + hang.RENDEZVOUS_MARGIN_SECONDS
    plan, job, _ = step(job, pods, 5)
    assert plan.status["phase"] == "Running", "a clock behind must not fail it at once"
    assert plan.requeue_after == pytest.approx(limit - 5)
    plan, _, _ = step(job, pods, limit - 1)
    assert plan.status["phase"] == "Running"
    plan, _, _ = step(job, pods, limit)
    assert plan.status["phase"] == "Failed", "a clock ahead must not postpone it an hour"
    assert plan.status["failure"]["reason"] == "RendezvousTimeout"


@pytest.mark.parametrize("skew", SKEWS)
def test_a_launcher_still_within_its_join_timeout_is_not_named_absent(skew: float) -> None:
    """Pod 0's launcher reports a rendezvous timeout at 22; pod 1 (node `skew` off) has been
    Running since 8, its own join timeout not yet spent: it is waiting, not the culprit."""
    job, pods = start(make_job(nodes=3, rendezvous={"joinTimeoutSeconds": 20}))
    pods = [
        on_node(pods[0], "Running", False, 1, 1, skew),
        on_node(pods[1], "Running", False, 8, 8, skew),
        on_node(pods[2], "Pending", False, 0, 0, skew),
    ]
    _, job, _ = step(job, pods, 1)
    _, job, _ = step(job, pods, 8)
    pods[0] = set_terminated(pods[0], 1, RDZV_TIMEOUT, t=21 + skew)
    plan, _, _ = step(job, pods, 22)
    failure = plan.status["failure"]
    assert failure["index"] == 2
    assert "job-1 (index 1)" not in failure["message"]
    assert "pods job-0, job-1 waited" in failure["message"]


# ---- the property ----------------------------------------------------------------------------

STATES = ["Pending", "NotReady", "Ready"]


@st.composite
def histories(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[float, list[str]]]]:
    """A job and what its pods did: per step (operator time), each pod's state."""
    nodes = draw(st.integers(1, 3))
    spec: dict[str, Any] = {
        "rendezvous": {"joinTimeoutSeconds": draw(st.sampled_from([10, 20]))},
        "failurePolicy": {"maxRestarts": 1, "backoffSeconds": 0},
    }
    if draw(st.booleans()):
        spec["runPolicy"] = {"progressTimeoutSeconds": 30}
    t, steps = 1.0, []
    for _ in range(draw(st.integers(1, 12))):
        t += draw(st.integers(1, 40))
        steps.append((t, [draw(st.sampled_from(STATES)) for _ in range(nodes)]))
    return make_job(nodes=nodes, **spec), steps


def decisions(
    job: dict[str, Any], steps: list[tuple[float, list[str]]], offset: float, lag: float
) -> list[tuple[Any, ...]]:
    """Reconcile the history with every kubelet time `offset` seconds off; what was decided
    at each step, until the attempt ends."""
    job, pods = start(job)
    started: dict[int, float] = {}
    since: dict[int, float] = {}
    states: dict[int, str] = {}
    out = []
    for t, now in steps:
        current = []
        for i, (pod, state) in enumerate(zip(pods, now, strict=True)):
            happened = t - lag  # a change happens a moment before the operator sees it
            if state != "Pending":
                started.setdefault(i, happened)
            if states.get(i) != state:
                since[i] = happened
            states[i] = state
            phase = "Pending" if state == "Pending" else "Running"
            current.append(
                on_node(pod, phase, state == "Ready", started.get(i, t), since[i], offset)
            )
        plan, job, _ = step(job, current, t)
        st_ = plan.status
        failure = st_.get("failure") or {}
        out.append(
            (
                st_["phase"],
                failure.get("reason"),
                failure.get("index"),
                failure.get("message"),
                plan.requeue_after,
                sorted(plan.delete),
            )
        )
        if st_["phase"] not in ("Pending", "Starting", "Running", "Waiting"):
            break
    return out


@settings(max_examples=40, deadline=None)
@given(
    history=histories(),
    offset=st.integers(-2 * 86400, 2 * 86400),
    lag=st.sampled_from([0.0, 1.0, 3.0]),
)
def test_shifting_every_node_time_by_a_constant_never_changes_the_hang_decision(
    history: tuple[dict[str, Any], list[tuple[float, list[str]]]], offset: int, lag: float
) -> None:
    job, steps = history
    assert decisions(job, steps, float(offset), lag) == decisions(job, steps, 0.0, lag)


# ---- the pure pieces -------------------------------------------------------------------------


def seen_view(ready: bool, phase: str = "Running", started: float = 0.0) -> Any:
    pod = on_node(
        {"metadata": {"name": "p", "labels": {"torchrun.dev/index": "0"}}, "spec": {}},
        phase,
        ready,
        started,
        started,
        0.0,
    )
    return view(pod, "trainer")


def test_observed_stamps_what_the_operator_saw_first_and_keeps_it_for_the_same_pod() -> None:
    now = at(50).timestamp()
    got = hang.observed(seen_view(False, started=10), {}, now)
    assert got == {hang.RUNNING_SEEN: iso(50), hang.NOT_READY_SEEN: iso(50)}
    before = {"pod": "p", **got}
    assert hang.observed(seen_view(False), before, now + 30) == got  # kept
    assert hang.observed(seen_view(True), before, now + 30) == {hang.RUNNING_SEEN: iso(50)}
    other = {"pod": "q", **got}  # another pod under the same index: its own times
    assert hang.observed(seen_view(True), other, now + 30) == {hang.RUNNING_SEEN: iso(80)}
    assert hang.observed(seen_view(False, "Pending"), {}, now) == {}


def test_observed_on_a_status_an_older_operator_wrote_uses_the_kubelet_start_never_later() -> None:
    now = at(50).timestamp()
    legacy = {"pod": "p", "phase": "Running", "startedAt": iso(10)}
    assert hang.observed(seen_view(True), legacy, now) == {hang.RUNNING_SEEN: iso(10)}
    ahead = {**legacy, "startedAt": iso(50 + HOUR)}
    assert hang.observed(seen_view(True), ahead, now) == {hang.RUNNING_SEEN: iso(50)}
