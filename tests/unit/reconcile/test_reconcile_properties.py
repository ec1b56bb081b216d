import re
from typing import Any

from dtj_factory import apply, at, failure, make_job, set_deleting, set_running, set_terminated
from hypothesis import given, settings
from hypothesis import strategies as st
from reports import report
from torchrun_operator.api.models import JobStatus
from torchrun_operator.reconcile import reconcile

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

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


@settings(max_examples=60, deadline=None)
@given(
    job=jobs(),
    steps=st.lists(
        st.tuples(st.sampled_from(ACTIONS), st.integers(0, 7), st.sampled_from([0.5, 3, 20])),
        max_size=25,
    ),
)
def test_reconcile_is_idempotent_and_pods_are_valid(
    job: dict[str, Any], steps: list[tuple[str, int, float]]
) -> None:
    pods: list[dict[str, Any]] = []
    t = 0.0
    for action, idx, dt in [("wait", 0, 0.0), *steps]:
        job, pods = act(action, pods, job, idx, t)
        observed = {p["metadata"]["name"] for p in pods}
        plan = reconcile(job, pods, at(t))
        JobStatus.model_validate(plan.status)
        created = [p["metadata"]["name"] for p in plan.create]
        assert len(created) == len(set(created))
        assert not set(created) & observed, "never create over an existing (even terminating) pod"
        for c in plan.create:
            assert DNS1123_LABEL.match(c["metadata"]["name"]) and len(c["metadata"]["name"]) <= 63
            assert len(c["spec"]["hostname"]) <= 63
        assert len(plan.status.get("ranks", [])) <= job["spec"]["nodes"]
        job, pods = apply(job, pods, plan, t)
        # Same inputs again (after the shell applied the plan): nothing new to do or say.
        again = reconcile(job, pods, at(t))
        assert again.create == []
        assert again.delete == []
        assert again.events == [], again.events
        job2 = {**job, "status": again.status}
        assert reconcile(job2, pods, at(t)).status == again.status
        job = job2
        t += dt
