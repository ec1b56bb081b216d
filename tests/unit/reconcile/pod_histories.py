"""Random pod histories for the reconciler's property tests: jobs of random shape (`jobs`),
the steps of a history (`STEPS`, walked in time by `timeline`), what each step does to the
job and its pods (`act`), and the reconciler driven through a history (`drive`), checking
after each step what holds for every plan (`settled`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dtj_factory import apply, at, failure, make_job, set_deleting, set_running, set_terminated
from hypothesis import strategies as st
from reports import report
from torchrun_operator.reconcile import Plan, reconcile

ACTIONS = [
    "run",
    "ready",
    "succeed",
    "exception",
    "comm",
    "oom",
    "exit1",
    "delete",
    "vanish",
    "gc",
    "suspend",
    "resume",
    "wait",
]


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    nodes = draw(st.integers(1, 4))
    spec: dict[str, Any] = {
        "successPolicy": draw(st.sampled_from(["AllRanks", "RankZero"])),
        "failurePolicy": {
            "maxRestarts": draw(st.integers(0, 3)),
            "backoffSeconds": draw(st.sampled_from([0, 5])),
        },
        "runPolicy": {"cleanPodPolicy": draw(st.sampled_from(["KeepFailed", "KeepAll", "Delete"]))},
    }
    if nodes > 1 and draw(st.booleans()):
        spec["elastic"] = {"minNodes": draw(st.integers(1, nodes))}
    name = draw(st.sampled_from(["j", "train-job", "x" * 60]))
    return make_job(name=name, nodes=nodes, **spec)


def act(
    action: str, pods: list[dict[str, Any]], job: dict[str, Any], idx: int, t: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if action == "gc":
        return job, live
    if action in ("suspend", "resume"):
        spec = {
            **job["spec"],
            "runPolicy": {**job["spec"]["runPolicy"], "suspend": action == "suspend"},
        }
        return {**job, "spec": spec}, pods
    if not live or action == "wait":
        return job, pods
    target = live[idx % len(live)]
    i = int(target["metadata"]["labels"]["torchrun.dev/node-rank"])
    ranks = [2 * i, 2 * i + 1]
    new: dict[str, Any] | None
    if action == "run":
        new = set_running(target, t=t)
    elif action == "ready":
        new = set_running(target, ready=True, t=t)
    elif action == "succeed":
        new = set_terminated(target, 0, report("Succeeded", ranks), t=t)
    elif action == "exception":
        new = set_terminated(
            target, 1, report("Failed", ranks, [failure(ranks[0], "exception", t, "E")]), t=t
        )
    elif action == "comm":
        new = set_terminated(
            target, 1, report("Failed", ranks, [failure(ranks[0], "comm", t, "C")]), t=t
        )
    elif action == "oom":
        new = set_terminated(target, 137, reason="OOMKilled", t=t)
    elif action == "exit1":
        new = set_terminated(target, 1, "garbage", t=t)
    elif action == "delete":
        new = set_deleting(target, t)
    else:  # vanish
        new = None
    out = [p for p in pods if p is not target]
    if new is not None:
        out.append(new)
    return job, out


# One step: an action, the index of the pod it acts on (modulo the live pods), and the
# seconds that pass after it.
Step = tuple[str, int, float]

STEPS = st.lists(
    st.tuples(st.sampled_from(ACTIONS), st.integers(0, 7), st.sampled_from([0.5, 3, 20])),
    max_size=25,
)


def timeline(steps: list[Step]) -> Iterator[tuple[str, int, float]]:
    """The history's actions with the pod index and the time each happens at: a first wait at
    0 s, then `steps`, each after the seconds the one before it let pass."""
    t = 0.0
    for action, idx, dt in [("wait", 0, 0.0), *steps]:
        yield action, idx, t
        t += dt


@dataclass(frozen=True)
class Moment:
    """One step of a driven history: the job and pods the reconciler saw at `t` (after the
    step's action) and the plan it made of them."""

    job: dict[str, Any]
    pods: list[dict[str, Any]]
    plan: Plan
    t: float


def settled(job: dict[str, Any], pods: list[dict[str, Any]], t: float) -> Plan:
    """Reconcile again what the shell made of the last plan, at the same time: nothing new to
    do or say, and its status is a fixed point. Returns that second plan."""
    again = reconcile(job, pods, at(t))
    assert again.create == []
    assert again.delete == []
    assert again.events == [], again.events
    assert again.transitions == [], again.transitions
    assert reconcile({**job, "status": again.status}, pods, at(t)).status == again.status
    return again


def drive(job: dict[str, Any], steps: list[Step]) -> Iterator[Moment]:
    """The reconciler through the history `steps`, starting from `job` with no pods: at each
    step the action happens, the reconciler plans (yielded, for the caller's checks), the
    shell applies the plan (and the plans that pods deleted by force wake), and the result is
    `settled`; the next step starts from there."""
    pods: list[dict[str, Any]] = []
    for action, idx, t in timeline(steps):
        job, pods = act(action, pods, job, idx, t)
        plan = reconcile(job, pods, at(t))
        yield Moment(job, pods, plan, t)
        job, pods = apply(job, pods, plan, t)
        while plan.force_delete:  # those pods left the API at once: their watch event wakes it
            plan = reconcile(job, pods, at(t))
            yield Moment(job, pods, plan, t)
            job, pods = apply(job, pods, plan, t)
        job = {**job, "status": settled(job, pods, t).status}
