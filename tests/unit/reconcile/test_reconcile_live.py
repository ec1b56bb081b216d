"""The live rank map and progress: what the pods' launcher status endpoints said, as an input
of reconcile (`live=`), per pod uid."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from dtj_factory import UID, at, iso, make_job, set_running, set_terminated, start, step
from jobs import condition as cond
from reports import report
from torchrun_operator.api.models import JobStatus
from torchrun_operator.reconcile import reconcile


def with_uid(pod: dict[str, Any], ready: bool = True, t: float = 1) -> dict[str, Any]:
    pod = set_running(pod, ready=ready, t=t)
    pod["metadata"]["uid"] = f"pod-{pod['metadata']['name']}"
    pod["status"]["podIP"] = f"10.0.0.{int(pod['metadata']['labels']['torchrun.dev/index']) + 2}"
    return pod


def answer(
    index: int,
    group_rank: int | None,
    ranks: list[int],
    attempt: int = 0,
    read_at: float = 5,
    progress: dict[str, Any] | None = None,
    stall: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "v": 1,
        "index": index,
        "rdzvId": f"{UID}-{attempt}",
        "state": "Training" if group_rank is not None else "Rendezvous",
        "groupRank": group_rank,
        "ranks": ranks,
        "round": 0 if group_rank is not None else None,
        "restarts": 0,
        **extra,
    }
    if progress is not None:
        data["progress"] = progress
    if stall is not None:
        data["stall"] = stall
    return {"at": at(read_at).timestamp(), "data": data}


def live_for(pods: list[dict[str, Any]], answers: dict[int, dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for pod in pods:
        i = int(pod["metadata"]["labels"]["torchrun.dev/index"])
        if i in answers:
            out[pod["metadata"]["uid"]] = answers[i]
    return out


def running_job(nodes: int = 3, **spec: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    job, pods = start(make_job(nodes=nodes, **spec))
    return job, [with_uid(p) for p in pods]


# c10d ordered the nodes by address: pod 0 got node rank 2, pod 1 node rank 0, pod 2 node rank 1.
MAP = {0: (2, [4, 5]), 1: (0, [0, 1]), 2: (1, [2, 3])}


def test_live_answers_fill_node_rank_global_ranks_and_round_by_pod_index() -> None:
    job, pods = running_job()
    answers = {i: answer(i, g, r) for i, (g, r) in MAP.items()}
    plan = reconcile(job, pods, at(5), live=live_for(pods, answers))
    ranks = plan.status["ranks"]
    assert [r["index"] for r in ranks] == [0, 1, 2]
    assert [(r["nodeRank"], r["globalRanks"], r["round"]) for r in ranks] == [
        (2, "4-5", 0),
        (0, "0-1", 0),
        (1, "2-3", 0),
    ]
    assert [r["pod"] for r in ranks] == ["job-0", "job-1", "job-2"]
    JobStatus.model_validate(plan.status)


def test_before_rendezvous_no_node_rank_is_claimed() -> None:
    job, pods = running_job()
    answers = {i: answer(i, None, []) for i in range(3)}
    ranks = reconcile(job, pods, at(5), live=live_for(pods, answers)).status["ranks"]
    assert all("nodeRank" not in r and "globalRanks" not in r for r in ranks)


@pytest.mark.parametrize(
    "bad",
    [
        {"rdzvId": "uid-1-7"},  # another attempt's launcher (a reused IP)
        {"index": 2},  # another pod's launcher
        {"v": 2},
    ],
)
def test_answers_from_another_pod_or_attempt_are_ignored(bad: dict[str, Any]) -> None:
    job, pods = running_job()
    a = answer(0, 2, [4, 5])
    a["data"].update(bad)
    ranks = reconcile(job, pods, at(5), live=live_for(pods, {0: a})).status["ranks"]
    assert "nodeRank" not in ranks[0]


@pytest.mark.parametrize(
    "garbled",
    [
        {"groupRank": "two"},
        {"ranks": [1, "x", -3, True]},
        {"round": -1},
        {"progress": {"step": "many"}},
        {"progress": {"step": 18446744073709551615}},  # a common "unknown" sentinel
    ],
)
def test_a_garbled_answer_is_refused_whole(garbled: dict[str, Any]) -> None:
    # One field out of its documented range: the answer says nothing about the pod.
    job, pods = running_job()
    a = answer(0, 2, [4, 5])
    a["data"].update(garbled)
    entry = reconcile(job, pods, at(5), live=live_for(pods, {0: a})).status["ranks"][0]
    assert "nodeRank" not in entry and "globalRanks" not in entry and "step" not in entry
    plan = reconcile(job, pods, at(5), live={pods[0]["metadata"]["uid"]: "not a dict"})
    assert "nodeRank" not in plan.status["ranks"][0]


@pytest.mark.parametrize("missing", ["rdzvId", "index"])
def test_an_answer_that_does_not_say_whose_it_is_is_ignored(missing: str) -> None:
    job, pods = running_job()
    a = answer(0, 2, [4, 5])
    del a["data"][missing]
    entry = reconcile(job, pods, at(5), live=live_for(pods, {0: a})).status["ranks"][0]
    assert "nodeRank" not in entry and "globalRanks" not in entry


def gone_quiet(
    job: dict[str, Any], pods: list[dict[str, Any]], t: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every pod withdraws readiness at `t` and the operator sees it then (the hang timers
    count from its own sighting): the job as reconciled at `t`, and the quiet pods."""
    quiet = []
    for p in pods:
        p = copy.deepcopy(p)
        p["status"]["conditions"][0].update(status="False", lastTransitionTime=iso(t))
        quiet.append(p)
    _, job, _ = step(job, quiet, t)
    return job, quiet


def test_a_pod_cannot_name_another_pods_rank_as_the_hang() -> None:
    # Pod 0 (ranks 0, 1) dumps a stack for rank 3, pod 1's: it is not believed.
    spec = {"runPolicy": {"progressTimeoutSeconds": 60}, "failurePolicy": {"maxRestarts": 0}}
    job, pods = running_job(nodes=2, **spec)
    plan, job, pods = step(job, pods, 5)
    job, quiet = gone_quiet(job, pods, 100)
    stall_at = at(99).timestamp()
    inside = {"inCollective": True, "at": "/w/t.py:30 in main"}
    answers = {
        0: answer(
            0,
            0,
            [0, 1],
            stall={
                "at": stall_at,
                "stacks": [
                    {"rank": 0, **inside},
                    {"rank": 3, "inCollective": False, "at": "/w/t.py:22 in lie"},
                ],
            },
        ),
        1: answer(1, 1, [2, 3], stall={"at": stall_at, "stacks": [{"rank": 3, **inside}]}),
    }
    plan = reconcile(job, quiet, at(111), live=live_for(quiet, answers))
    failure = plan.status["failure"]
    assert failure["reason"] == "ProgressStalled"
    assert "lie" not in failure.get("location", "") and "lie" not in failure["message"]


def test_the_status_remembers_the_map_when_no_answer_comes_for_the_same_pod() -> None:
    job, pods = running_job()
    answers = {i: answer(i, g, r) for i, (g, r) in MAP.items()}
    plan = reconcile(job, pods, at(5), live=live_for(pods, answers))
    job = {**job, "status": plan.status}
    # A restarted operator has read nothing yet: the entries keep what the status said.
    again = reconcile(job, pods, at(6)).status["ranks"]
    assert [r["nodeRank"] for r in again] == [2, 0, 1]
    assert again == plan.status["ranks"]


def test_the_final_report_outranks_the_live_answer() -> None:
    job, pods = running_job(nodes=2)
    pods[0] = set_terminated(pods[0], 0, report("Succeeded", [0, 1], group_rank=0))
    live = live_for(pods[1:], {1: answer(1, 1, [2, 3])})
    live[pods[0]["metadata"].get("uid", "x")] = answer(0, 1, [2, 3])
    ranks = reconcile(job, pods, at(15), live=live).status["ranks"]
    assert (ranks[0]["nodeRank"], ranks[0]["globalRanks"]) == (0, "0-1")
    assert (ranks[1]["nodeRank"], ranks[1]["globalRanks"]) == (1, "2-3")


def test_a_status_written_before_the_index_field_reads_nodeRank_as_the_index() -> None:
    job, pods = running_job(nodes=2)
    old = [
        {"nodeRank": 0, "pod": "job-0", "phase": "Running", "failureObservedAt": iso(3)},
        {"nodeRank": 1, "pod": "job-1", "phase": "Running"},
    ]
    job = {**job, "status": {**job["status"], "ranks": old}}
    plan = reconcile(job, pods, at(5), live=live_for(pods, {0: answer(0, 1, [2, 3])}))
    ranks = plan.status["ranks"]
    assert [r["index"] for r in ranks] == [0, 1]
    assert ranks[0]["nodeRank"] == 1  # torchrun's, from the launcher
    assert "nodeRank" not in ranks[1]  # the old field was the index: not carried over
    JobStatus.model_validate(plan.status)


def test_a_lost_pods_failure_names_its_index_and_the_node_rank_it_had() -> None:
    job, pods = running_job(nodes=2, failurePolicy={"backoffSeconds": 0})
    answers = {0: answer(0, 1, [2, 3]), 1: answer(1, 0, [0, 1])}
    plan = reconcile(job, pods, at(5), live=live_for(pods, answers))
    job = {**job, "status": plan.status}
    plan = reconcile(job, [pods[1]], at(8), live=live_for(pods, answers))  # pod 0 vanished
    failure = plan.status["failure"]
    assert (failure["index"], failure["nodeRank"], failure["reason"]) == (0, 1, "PodDeleted")
    record = plan.status["restarts"][-1]
    assert (record["index"], record["nodeRank"]) == (0, 1)
    assert "pod job-0 (index 0, node rank 1" in next(
        e.message for e in plan.events if e.reason == "RankFailed"
    )


# ---- progress ------------------------------------------------------------------------------


def progress(step: int, rate: float, last: float, **extra: Any) -> dict[str, Any]:
    return {
        "step": step,
        "stepsPerSecond": rate,
        "stepSeconds": 1 / rate,
        "lastStepAt": at(last).timestamp(),
        "windowSeconds": 60,
        "windowFull": True,
        **extra,
    }


def test_per_pod_progress_and_the_jobs_eta() -> None:
    job, pods = running_job()
    answers = {
        0: answer(0, 2, [4, 5], progress=progress(120, 2.0, 30, total=1000)),
        1: answer(1, 0, [0, 1], progress=progress(118, 2.0, 29.5, total=1000)),
        2: answer(2, 1, [2, 3], progress=progress(121, 2.0004, 30.2, total=1000)),
    }
    plan = reconcile(job, pods, at(31), live=live_for(pods, answers))
    st = plan.status
    assert [r["step"] for r in st["ranks"]] == [120, 118, 121]
    assert st["ranks"][2]["stepsPerSecond"] == 2.0  # three significant digits
    assert st["ranks"][1]["lastStepAt"] == iso(29.5)
    # The job: every pod got to 118; (1000 - 118) / 2 steps/s after pod 1's last step.
    assert st["progress"] == {
        "step": 118,
        "totalSteps": 1000,
        "stepsPerSecond": 2.0,
        "eta": iso(29.5 + 882 / 2),
        "startStep": 118,  # the first step the operator saw of the attempt
    }
    # The same answers read later change nothing (no status write for nothing).
    again = reconcile({**job, "status": st}, pods, at(45), live=live_for(pods, answers))
    assert again.status == st
    JobStatus.model_validate(st)


def test_a_new_attempt_starts_without_the_old_progress() -> None:
    job, pods = running_job(nodes=2, failurePolicy={"backoffSeconds": 0})
    answers = {i: answer(i, i, [2 * i, 2 * i + 1], progress=progress(50, 1, 4)) for i in (0, 1)}
    plan = reconcile(job, pods, at(5), live=live_for(pods, answers))
    assert plan.status["progress"]["step"] == 50
    job = {**job, "status": plan.status}
    dead = [set_terminated(p, 137, reason="OOMKilled", t=6) for p in pods]
    plan = reconcile(job, dead, at(30))
    assert plan.status["phase"] == "Restarting" and "progress" not in plan.status
    assert plan.status["failure"]["step"] == 50
    assert plan.status["restarts"][-1]["step"] == 50


STRAGGLER: dict[str, Any] = {"monitoring": {"straggler": {"factor": 2.0, "windowSeconds": 30}}}


def test_straggler_condition_names_the_slow_pod_and_clears_when_it_catches_up() -> None:
    job, pods = running_job(**STRAGGLER)
    pods = [with_uid(p) for p in pods]
    fast, slow = progress(100, 2.0, 30), progress(100, 2.0, 30, stepSeconds=1.6)
    answers = {0: answer(0, 2, [4, 5], progress=fast), 1: answer(1, 0, [0, 1], progress=slow)}
    answers[2] = answer(2, 1, [2, 3], progress={**fast, "stepSeconds": 0.45})
    plan = reconcile(job, pods, at(31), live=live_for(pods, answers))
    st = plan.status
    assert st["phase"] == "Running"
    straggler = cond(st, "Straggler")
    assert straggler is not None and straggler["status"] == "True"
    assert straggler["reason"] == "SlowPods"
    message = straggler["message"]
    assert "pod job-1 (index 1, node rank 0, global ranks 0-1) takes 1.6s per step" in message
    assert "3.2x the median" in message and "job-0" not in message and "job-2" not in message
    assert [e.reason for e in plan.events].count("Straggler") == 1
    # Told again: no second event.
    plan = reconcile({**job, "status": st}, pods, at(40), live=live_for(pods, answers))
    assert "Straggler" not in [e.reason for e in plan.events]
    answers[1] = answer(1, 0, [0, 1], progress=fast)
    plan = reconcile({**job, "status": st}, pods, at(50), live=live_for(pods, answers))
    cleared = cond(plan.status, "Straggler")
    assert cleared is not None and (cleared["status"], cleared["reason"]) == (
        "False",
        "NoStragglers",
    )


def test_no_straggler_judgement_before_full_windows_or_without_opting_in() -> None:
    job, pods = running_job(**STRAGGLER)
    young = {**progress(10, 2.0, 5), "windowFull": False}
    answers = {i: answer(i, i, [2 * i, 2 * i + 1], progress=young) for i in range(3)}
    answers[1]["data"]["progress"]["stepSeconds"] = 9.0
    st = reconcile(job, pods, at(6), live=live_for(pods, answers)).status
    measuring = cond(st, "Straggler")
    assert measuring is not None and (measuring["status"], measuring["reason"]) == (
        "False",
        "Measuring",
    )
    job, pods = running_job()
    full = {i: answer(i, i, [2 * i, 2 * i + 1], progress=progress(10, 2.0, 5)) for i in range(3)}
    full[1]["data"]["progress"]["stepSeconds"] = 9.0
    assert cond(reconcile(job, pods, at(6), live=live_for(pods, full)).status, "Straggler") is None


def test_two_pods_the_faster_is_the_yardstick() -> None:
    job, pods = running_job(nodes=2, **STRAGGLER)
    answers = {
        0: answer(0, 0, [0, 1], progress=progress(10, 2.0, 5)),
        1: answer(1, 1, [2, 3], progress={**progress(10, 2.0, 5), "stepSeconds": 1.5}),
    }
    st = reconcile(job, pods, at(6), live=live_for(pods, answers)).status
    assert cond(st, "Straggler")["status"] == "True"


# ---- a stall names the rank that is not inside a collective --------------------------------


def test_stall_names_the_rank_outside_any_collective_with_its_line() -> None:
    spec = {"runPolicy": {"progressTimeoutSeconds": 60}, "failurePolicy": {"maxRestarts": 0}}
    job, pods = running_job(nodes=2, **spec)
    plan, job, pods = step(job, pods, 5)  # rendezvous done at 5
    assert cond(plan.status, "RendezvousDone")["status"] == "True"
    job, quiet = gone_quiet(job, pods, 100)
    stall_at = at(99).timestamp()
    waiting = {"rank": 0, "localRank": 0, "inCollective": True, "at": "/w/t.py:30 in main"}
    answers = {
        0: answer(0, 0, [0, 1], stall={"at": stall_at, "step": 7, "stacks": [waiting]}),
        1: answer(
            1,
            1,
            [2, 3],
            stall={
                "at": stall_at + 0.5,
                "step": 7,
                "stacks": [
                    {"rank": 2, "localRank": 0, "inCollective": True, "at": "/w/t.py:30 in main"},
                    {"rank": 3, "localRank": 1, "inCollective": False, "at": "/w/t.py:22 in load"},
                ],
            },
        ),
    }
    plan = reconcile(job, quiet, at(111), live=live_for(quiet, answers))
    failure = plan.status["failure"]
    assert (failure["reason"], failure["rank"], failure["index"]) == ("ProgressStalled", 3, 1)
    assert failure["location"] == "/w/t.py:22 in load"
    assert failure["pod"] == "job-1" and failure["nodeRank"] == 1
    assert failure["message"].startswith(
        "rank 3 (pod job-1) is not inside a collective at /w/t.py:22 in load while other "
        "ranks wait in one"
    )
    assert "reported no training progress" in failure["message"]
    JobStatus.model_validate(plan.status)


def back_at_300_to_a_half_ready_gang() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Two pods the operator saw Running, not Ready, at 2 (the rendezvous timer starts), and
    next sees at 300: pod 0 Ready, pod 1 gone quiet (progressTimeoutSeconds and the join
    timeout 20 s)."""
    spec = make_job(
        nodes=2, runPolicy={"progressTimeoutSeconds": 20}, rendezvous={"joinTimeoutSeconds": 20}
    )
    job, pods = start(spec)
    pods = [with_uid(p, ready=False) for p in pods]
    _, job, _ = step(job, pods, 2)
    return job, [with_uid(pods[0], ready=True), with_uid(pods[1], ready=False, t=300)]


def test_a_stall_seen_only_after_the_ready_window_is_no_rendezvous_hang() -> None:
    # The operator saw the pods Running but never all Ready at once (it was away while they
    # were): the launchers' answers still say the rendezvous completed, so the quiet pod is a
    # stall to restart, not a rendezvous that timed out (a user failure that ends the job).
    job, quiet = back_at_300_to_a_half_ready_gang()
    stalled = {"at": at(290).timestamp(), "step": 3, "stacks": []}
    answers = {
        0: answer(0, 0, [0], read_at=300),
        1: answer(1, 1, [1], read_at=300, stall=stalled, state="Stalled"),
    }
    plan = reconcile(job, quiet, at(300), live=live_for(quiet, answers))
    status = plan.status
    assert status["phase"] == "Running", status.get("failure")
    assert cond(status, "RendezvousDone")["status"] == "True"
    job = {**job, "status": copy.deepcopy(status)}
    plan = reconcile(job, quiet, at(320), live=live_for(quiet, answers))
    status = plan.status
    assert (status["phase"], status["attempt"]) == ("Restarting", 1)
    assert status["failure"]["reason"] == "ProgressStalled"
    assert status["restarts"][-1]["kind"] == "infrastructure"


def test_a_new_leader_without_answers_judges_a_half_ready_gang_a_stall() -> None:
    # The same, seen by an operator that has read no launcher yet (it just took over): one
    # pod Ready means the round completed, and without elastic bounds a round holds every pod.
    job, quiet = back_at_300_to_a_half_ready_gang()
    plan, job, _ = step(job, quiet, 300)
    assert plan.status["phase"] == "Running", plan.status.get("failure")
    plan, _, _ = step(job, quiet, 320)
    assert (plan.status["phase"], plan.status["failure"]["reason"]) == (
        "Restarting",
        "ProgressStalled",
    )


def test_stall_without_stacks_names_the_pod_that_went_quiet_first() -> None:
    spec = {"runPolicy": {"progressTimeoutSeconds": 60}, "failurePolicy": {"maxRestarts": 0}}
    job, pods = running_job(nodes=2, **spec)
    _, job, pods = step(job, pods, 5)
    quiet = copy.deepcopy(pods)
    quiet[1]["status"]["conditions"][0].update(status="False", lastTransitionTime=iso(100))
    _, job, _ = step(job, quiet, 100)
    failure = reconcile(job, quiet, at(111)).status["failure"]
    assert (failure["index"], failure["pod"]) == (1, "job-1") and "location" not in failure
    assert failure["message"].startswith("pod job-1 reported no training progress")


def test_an_old_finished_status_is_migrated_so_it_stays_writable() -> None:
    # Written by an operator before `index`: every nodeRank there is a pod index. The CRD now
    # requires ranks[].index, so the next write must carry it.
    job = make_job(nodes=2)
    job["status"] = {
        "phase": "Failed",
        "attempt": 1,
        "ranks": [{"nodeRank": 0, "pod": "job-0-a1"}, {"nodeRank": 1, "pod": "job-1-a1"}],
        "failure": {"rank": 3, "nodeRank": 1, "pod": "job-1-a1", "reason": "Exception"},
        "restarts": [{"attempt": 1, "at": iso(1), "nodeRank": 0, "kind": "infrastructure"}],
        "completionTime": iso(9),
    }
    st = reconcile(job, [], at(10)).status
    assert [r["index"] for r in st["ranks"]] == [0, 1]
    assert all("nodeRank" not in r for r in st["ranks"])
    assert (st["failure"]["index"], st["failure"].get("nodeRank")) == (1, None)
    assert st["restarts"][0]["index"] == 0 and "nodeRank" not in st["restarts"][0]
    JobStatus.model_validate(st)
