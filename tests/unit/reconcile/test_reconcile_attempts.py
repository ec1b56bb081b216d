"""Attempts never mix: a pod of an older attempt is deleted whenever it is seen, and a spec
that changed under a running attempt starts a new one (reconcile/attempts.py)."""

import copy
from typing import Any

from dtj_factory import (
    apply,
    at,
    drop_terminating,
    make_job,
    set_running,
    start,
    step,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs import condition as cond
from jobs import trainer_of
from torchrun_operator.api.models import JobSpec, JobStatus
from torchrun_operator.reconcile import reconcile
from torchrun_operator.reconcile.attempts import spec_hash
from torchrun_operator.render import render_pod


def names(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


def running(job: dict[str, Any], t: float = 2) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`job` started, every pod running and ready."""
    job, pods = start(job)
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, t)
    assert job["status"]["phase"] == "Running"
    return job, pods


def attempt_one(nodes: int = 2) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A job in attempt 1 (suspended and resumed), every pod of it running and ready."""
    job, pods = running(make_job(nodes=nodes))
    job["spec"]["runPolicy"] = {"suspend": True}
    _, job, pods = step(job, pods, 3)
    job["spec"]["runPolicy"] = {"suspend": False}
    _, job, pods = step(job, drop_terminating(pods), 4)
    pods = [set_running(p, ready=True) for p in pods]
    _, job, pods = step(job, pods, 5)
    assert job["status"]["attempt"] == 1 and job["status"]["phase"] == "Running"
    return job, pods


# ---- item 2: a pod of an older attempt is deleted whenever it is seen ----------------------


def test_a_late_pod_of_an_older_attempt_is_deleted_while_the_next_attempt_runs() -> None:
    job, pods = attempt_one()
    # attempt 0's create of index 0, committed late (its hostname is attempt 0's, so the DNS
    # never answers attempt 1's rendezvous host with it; it still holds a node's GPUs)
    late = set_running(render_pod(job, 0, 0), ready=True)
    plan = reconcile(job, [*pods, late], at(10))
    assert plan.delete == ["job-0"]
    assert plan.create == [] and plan.events == []
    # Not counted as the attempt's: no failure, no restart, the ranks are attempt 1's.
    assert plan.status["phase"] == "Running" and plan.status["attempt"] == 1
    assert [r["pod"] for r in plan.status["ranks"]] == ["job-0-a1", "job-1-a1"]
    assert plan.status["counters"] == job["status"]["counters"]
    # Once it terminates, nothing more is done about it.
    _, pods2 = apply(job, [*pods, late], plan, 10)
    again = reconcile(job, pods2, at(11))
    assert again.delete == [] and again.create == []


def test_an_older_attempts_pod_that_is_not_the_jobs_is_left_alone() -> None:
    job, pods = attempt_one()
    late = render_pod(job, 0, 0)
    late["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    assert reconcile(job, [*pods, late], at(10)).delete == []


# ---- item 3: the spec an attempt runs ----------------------------------------------------


def test_an_attempt_records_the_hash_of_the_spec_it_started_from() -> None:
    job = make_job(nodes=2)
    plan = reconcile(job, [], at(0))
    assert plan.status["attemptSpecHash"] == spec_hash(JobSpec.model_validate(job["spec"]))
    JobStatus.model_validate(plan.status)


def test_a_missed_suspend_with_more_nodes_starts_a_new_attempt_of_the_new_shape() -> None:
    job, pods = running(make_job(nodes=2))
    # Suspended with nodes: 3 and resumed while the operator was down: it sees Running.
    job["spec"]["nodes"] = 3
    plan, job, pods = step(job, pods, 10)
    assert plan.create == [], "never a pod of the new shape in attempt 0"
    assert sorted(plan.delete) == ["job-0", "job-1"]
    st = plan.status
    assert st["attempt"] == 1 and st["phase"] == "Pending"
    assert st["restarts"][-1]["reason"] == "SpecChanged"
    assert st["restarts"][-1]["kind"] == "suspend"
    assert st["counters"]["restarts"] == 0
    assert cond(st, "Running")["status"] == "False"
    assert cond(st, "RendezvousDone")["status"] == "False"
    assert [e.reason for e in plan.events] == ["SpecChanged"]
    # Intent first: the recorded hash is still attempt 0's until attempt 1 creates its pods.
    assert st["attemptSpecHash"] == job["status"]["attemptSpecHash"]
    plan, job, pods = step(job, drop_terminating(pods), 11)
    assert names(plan.create) == ["job-0-a1", "job-1-a1", "job-2-a1"]
    assert {p["args"][p["args"].index("--nnodes") + 1] for p in _trainers(plan.create)} == {"3"}
    assert plan.status["attemptSpecHash"] == spec_hash(JobSpec.model_validate(job["spec"]))
    JobStatus.model_validate(plan.status)


def _trainers(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p["spec"]["containers"][0] for p in pods]


def test_a_changed_template_under_a_running_attempt_starts_a_new_attempt() -> None:
    job, pods = running(make_job(nodes=2))
    trainer_of(job)["image"] = "img:v2"
    plan, job, pods = step(job, pods, 10)
    assert plan.create == [] and plan.status["attempt"] == 1
    plan, _, _ = step(job, drop_terminating(pods), 11)
    assert {c["image"] for c in _trainers(plan.create)} == {"img:v2"}


def test_a_lost_pod_of_a_changed_job_is_not_recreated_from_the_new_spec() -> None:
    job, pods = start(make_job(nodes=2))
    # job-1 was planned but is not seen yet, and the template changed meanwhile.
    trainer_of(job)["image"] = "img:v2"
    plan = reconcile(job, pods[:1], at(1))
    assert plan.create == [] and plan.status["attempt"] == 1


def test_an_elastic_job_scales_within_its_attempt() -> None:
    job, pods = running(make_job(nodes=2, elastic={"minNodes": 1, "maxNodes": 4}))
    job["spec"]["nodes"] = 3
    plan, _, _ = step(job, pods, 10)
    assert names(plan.create) == ["job-2"]
    assert plan.delete == [] and plan.status["attempt"] == 0


def test_a_status_without_a_hash_adopts_the_current_spec_without_restarting() -> None:
    job, pods = running(make_job(nodes=2))
    # written by the previous operator version, which recorded no hash
    del job["status"]["attemptSpecHash"]
    plan, job, pods = step(job, pods, 10)
    assert plan.create == [] and plan.delete == [] and plan.events == []
    assert plan.status["attempt"] == 0 and plan.status["phase"] == "Running"
    assert plan.status["attemptSpecHash"] == spec_hash(JobSpec.model_validate(job["spec"]))


def test_fields_that_do_not_shape_pods_change_without_a_new_attempt() -> None:
    job, pods = running(make_job(nodes=2))
    job["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 60, "activeDeadlineSeconds": 9000}
    job["spec"]["failurePolicy"] = {"maxRestarts": 5}
    job["spec"]["monitoring"] = {"straggler": {}}
    plan, _, _ = step(job, pods, 10)
    assert plan.create == [] and plan.delete == [] and plan.status["attempt"] == 0


# ---- spec_hash ----------------------------------------------------------------------------

BASE = make_job(nodes=2)["spec"]


def spec_of(**changes: Any) -> JobSpec:
    spec = copy.deepcopy(BASE)
    spec.update(copy.deepcopy(changes))
    return JobSpec.model_validate(spec)


IRRELEVANT = st.fixed_dictionaries(
    {},
    optional={
        "runPolicy": st.fixed_dictionaries(
            {},
            optional={
                "ttlSecondsAfterFinished": st.integers(0, 10**6),
                "activeDeadlineSeconds": st.integers(1, 10**6),
                "cleanPodPolicy": st.sampled_from(["KeepFailed", "KeepAll", "Delete"]),
                "suspend": st.booleans(),
                "progressTimeoutSeconds": st.integers(1, 3600),
            },
        ),
        "failurePolicy": st.fixed_dictionaries(
            {},
            optional={
                "maxRestarts": st.integers(0, 100),
                "backoffSeconds": st.integers(0, 3600),
                "retryableExitCodes": st.lists(st.integers(-255, 255), max_size=4),
            },
        ),
        "successPolicy": st.sampled_from(["AllRanks", "RankZero"]),
        "monitoring": st.sampled_from([{}, {"straggler": {}}, {"straggler": {"factor": 3.0}}]),
        "networkPolicy": st.sampled_from([{}, {"enabled": True}, {"enabled": False}]),
    },
)


def template(image: str = "img", labels: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = copy.deepcopy(BASE["template"])
    out["spec"]["containers"][0]["image"] = image
    if labels:
        out["metadata"] = {"labels": labels}
    return out


SHAPING = st.sampled_from(
    [
        {"nodes": 3},
        {"nprocPerNode": 4},
        {"torchrun": {"maxRestarts": 2}},
        {"rendezvous": {"port": 29500}},
        {"elastic": {"minNodes": 1}},
        {"template": template(image="img:v2")},
        {"template": template(labels={"team": "a"})},
    ]
)


@settings(max_examples=100, deadline=None)
@given(irrelevant=IRRELEVANT, shaping=SHAPING)
def test_spec_hash_follows_exactly_the_fields_that_shape_pods(
    irrelevant: dict[str, Any], shaping: dict[str, Any]
) -> None:
    base = spec_hash(spec_of())
    assert spec_hash(spec_of(**irrelevant)) == base
    changed = spec_hash(spec_of(**shaping))
    assert changed != base
    assert spec_hash(spec_of(**shaping, **irrelevant)) == changed


def test_spec_hash_ignores_defaults_spelled_out_and_elastic_nodes() -> None:
    base = spec_hash(spec_of())
    assert spec_hash(spec_of(rendezvous={"port": 29400}, torchrun={"maxRestarts": 0})) == base
    elastic = {"minNodes": 1, "maxNodes": 4}
    assert spec_hash(spec_of(nodes=2, elastic=elastic)) == spec_hash(
        spec_of(nodes=4, elastic=elastic)
    )
