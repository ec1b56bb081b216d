"""Hangs no process reports: a rendezvous that never completes, training that goes quiet."""

from __future__ import annotations

import copy
from typing import Any

import jobs
import pace
import pytest
from dtj import REPO, apply, load_docs, one_per_node, pod_log, wait_phase
from kubernetes import client

pytestmark = pytest.mark.usefixtures("operator")

SLEEP = "import time; time.sleep(3600)\n"


def sleeper(name: str, nodes: int, **spec: Any) -> list[dict[str, Any]]:
    """A job whose workers would just sleep (they never get that far in these tests)."""
    return jobs.scripted(
        name,
        {"sleep.py": SLEEP},
        ["python", "/workspace/sleep.py"],
        nodes=nodes,
        nproc=1,
        image="python:3.11",
        pod={"terminationGracePeriodSeconds": 3},
        **{"failurePolicy": {"maxRestarts": 0}, **spec},
    )


def test_rendezvous_that_never_completes_names_the_pod_that_never_started(
    kube: client.ApiClient, namespace: str
) -> None:
    nodes, cpu = one_per_node(kube)
    docs = sleeper("never-meets", nodes + 1, rendezvous={"joinTimeoutSeconds": 20})
    # Each pod asks for more than half a node's CPUs: one pod more than there are nodes, so
    # one stays Pending (which one is the scheduler's choice).
    trainer = docs[1]["spec"]["template"]["spec"]["containers"][0]
    trainer["resources"] = {"requests": {"cpu": cpu}}
    apply(kube, namespace, docs)
    # The pods that run start their launchers, then wait out the join timeout.
    budget = pace.attempts(pods=nodes) + 20
    done = wait_phase(kube, namespace, "never-meets", {"Succeeded", "Failed"}, timeout=budget)
    status = done["status"]
    assert status["phase"] == "Failed", status
    failure = status["failure"]
    assert failure["reason"] == "RendezvousTimeout"
    missing = failure["index"]
    assert failure["pod"] == f"never-meets-{missing}", failure
    ranks = {r["index"]: r for r in status["ranks"]}
    assert sorted(ranks) == list(range(nodes + 1)), status["ranks"]
    # The others ran, waiting for it.
    others = [r for i, r in ranks.items() if i != missing]
    assert all(r.get("startedAt") for r in others), status["ranks"]
    # The missing pod stays Pending to the end, unless the scheduler bound it in the room the
    # others freed when they gave up (then clean-up stopped it): it started no earlier than
    # they ended.
    late = ranks[missing]
    if late["phase"] != "Pending":
        ends = [r["finishedAt"] for r in others if r.get("finishedAt")]
        assert ends, status["ranks"]  # only an other's end made room for it
        assert late.get("startedAt") is None or late["startedAt"] >= min(ends), status["ranks"]
    message = failure["message"]
    # "(Pending: Unschedulable, 0/N nodes are available ...)" while it waits; "in time
    # (Pending until the others gave up waiting)" when the scheduler bound it in the freed
    # room and it ran by the time the operator looked.
    assert f"pod never-meets-{missing} (index {missing}) never started" in message, message
    # Either the others' launchers reported their join timeout, or (when the missing pod is
    # pod 0, whose DNS name they wait for) the operator's own timer fired.
    assert "joinTimeoutSeconds (20s)" in message, message
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "RendezvousTimeout"
    assert f"never-meets-{missing}" in failed["message"]


def test_rendezvous_hung_with_every_launcher_stuck_fails_on_the_operators_timer(
    kube: client.ApiClient, namespace: str
) -> None:
    # Every launcher hangs before it starts (the interpreter imports this sitecustomize), so
    # no pod ever turns Ready and no launcher ever reports.
    docs = sleeper("stuck", 2, rendezvous={"joinTimeoutSeconds": 10})
    docs[0]["data"]["sitecustomize.py"] = SLEEP
    trainer = docs[1]["spec"]["template"]["spec"]["containers"][0]
    trainer["env"] = [{"name": "PYTHONPATH", "value": "/workspace"}]
    apply(kube, namespace, docs)
    # Pods that start (their interpreters hang at once), then the join timeout.
    budget = pace.attempts() + 10
    done = wait_phase(kube, namespace, "stuck", {"Succeeded", "Failed"}, timeout=budget)
    status = done["status"]
    assert status["phase"] == "Failed", status
    failure = status["failure"]
    assert (failure["reason"], failure["kind"]) == ("RendezvousTimeout", "rendezvous")
    message = failure["message"]
    assert "joinTimeoutSeconds (10s)" in message and "no launcher reported" in message
    for i in (0, 1):
        assert f"pod stuck-{i} (index {i}) is Running but never joined" in message
    assert all(r["phase"] == "Running" and not r["ready"] for r in status["ranks"])


def test_a_rank_that_stops_reporting_progress_fails_the_job_as_progress_stalled(
    kube: client.ApiClient, namespace: str
) -> None:
    docs = load_docs(REPO / "examples" / "progress.yaml")
    job = next(d for d in docs if d["kind"] == "DistributedTrainingJob")
    spec = job["spec"]
    spec["nprocPerNode"] = 1
    spec["failurePolicy"] = {"maxRestarts": 0}
    # Long enough for the workers to start (imports, process group) before step 1 on a
    # loaded machine: the clock starts at rendezvous (20 s was seen too short, with a rank
    # still importing torch beside three other clusters on 2 cores, and 30 s too).
    # KeepAll: the pods (and so their logs, read below) stay after the job failed.
    spec["runPolicy"] = {"progressTimeoutSeconds": 60, "cleanPodPolicy": "KeepAll"}
    trainer = spec["template"]["spec"]["containers"][0]
    # Global rank 1 hangs after step 3; rank 0 trains on (weights averaged only at the end).
    trainer["args"] = [
        *["--steps", "400", "--step-sleep", "0.2", "--sync-every", "1000"],
        *["--stall-rank", "1", "--stall-after-step", "3"],
    ]
    spec["template"]["spec"]["terminationGracePeriodSeconds"] = 3
    apply(kube, namespace, copy.deepcopy(docs))
    # The gang's start, its steps up to the stall, then the progress timeout.
    budget = pace.attempts() + 3 * 0.2 + 60
    done = wait_phase(kube, namespace, "progress", {"Succeeded", "Failed"}, timeout=budget)
    status = done["status"]
    assert status["phase"] == "Failed", status
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "RestartBudgetExhausted"
    assert "ProgressStalled" in failed["message"]
    failure = status["failure"]
    assert (failure["reason"], failure["kind"]) == ("ProgressStalled", "stalled")
    assert "progressTimeoutSeconds (60s)" in failure["message"]
    assert status["counters"]["infrastructureFailures"] == 1

    # The pod named is the one whose rank hung: its launcher logged the stall, naming rank 1.
    text = {i: pod_log(kube, namespace, f"progress-{i}") for i in (0, 1)}
    stalled = [i for i in (0, 1) if "rank 1: hanging after step 3" in text[i]]
    index = failure["index"]
    assert stalled == [index], {i: t[-2000:] for i, t in text.items()}
    assert failure["pod"] == f"progress-{index}"
    assert "progress stalled" in text[index]
    assert "ranks=1" in text[index]
    assert f"pod progress-{index} reported no training progress" in failure["message"]
    # The launcher had the quiet pod's worker dump its stacks: rank 1 hangs outside any
    # collective, at the script's sleep.
    assert failure["rank"] == 1 and "train_progress.py:" in failure["location"], failure
    assert "stacks of a stalled rank" in text[index]
    assert f"progress-{1 - index}" not in failure["message"]
