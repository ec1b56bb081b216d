"""Live progress per pod while the job runs: steps, steps per second, the last step's time, the
job's step and ETA, the same as Prometheus metrics; a Straggler condition naming the pod whose
rank is slow; and a hang whose failure names the rank that is not inside a collective, with
its file and line, from the stacks the stalled pods' launchers had their workers dump."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pace
import pytest
from dtj import apply, get_job, pod_log, wait_for, wait_phase
from jobs import condition
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from test_rankmap import TRAIN, script_job

pytestmark = pytest.mark.usefixtures("operator")


def test_progress_straggler_and_metrics_while_the_job_runs(
    kube: client.ApiClient, namespace: str, operator: Any
) -> None:
    # Synchronous training (a barrier every step): every pod advances at the slowest rank's
    # pace, so each reports the seconds its rank spent on its own work ("stepTime"); global
    # rank 1 takes four times as long as the others.
    docs = script_job(
        "progress-live",
        3,
        1,
        # Long enough that the job still runs when the metrics are read below, on a loaded
        # machine too (with 45 steps the rank gauges were once missing from that read).
        STEPS="90",
        STEP_SLEEP="0.2",
        SLOW_RANK="1",
        DECLARE_TOTAL="1",
    )
    docs[1]["spec"]["monitoring"] = {"straggler": {"factor": 2.0, "windowSeconds": 8}}
    apply(kube, namespace, docs)

    def straggling() -> dict[str, Any] | None:
        status = get_job(kube, namespace, "progress-live").get("status") or {}
        assert status.get("phase") not in ("Succeeded", "Failed"), status
        c = condition(status, "Straggler")
        return status if c and c["status"] == "True" else None

    # The gang's start, then the straggler window.
    status = wait_for("the Straggler condition", straggling, timeout=pace.attempts(pods=3) + 8)
    slow = next(r for r in status["ranks"] if r.get("globalRanks") == "1")
    message = condition(status, "Straggler")["message"]
    assert f"pod {slow['pod']} (index {slow['index']}, node rank {slow['nodeRank']}" in message
    others = [r["pod"] for r in status["ranks"] if r["pod"] != slow["pod"]]
    assert not any(f"pod {p} " in message for p in others), message
    for r in status["ranks"]:
        assert r["phase"] == "Running" and r["step"] >= 1, r
        assert r["stepsPerSecond"] > 0 and r["lastStepAt"], r
    assert slow["stepSeconds"] > 2 * max(
        r["stepSeconds"] for r in status["ranks"] if r is not slow
    ), status["ranks"]
    progress = status["progress"]
    assert progress["totalSteps"] == 90 and 1 <= progress["step"] < 90, progress
    assert progress["stepsPerSecond"] > 0 and progress["eta"], progress

    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        families = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
    steps = [
        s
        for s in families["torchrun_operator_rank_step"].samples
        if s.labels["job"] == "progress-live" and s.labels["namespace"] == namespace
    ]
    assert sorted(s.labels["index"] for s in steps) == ["0", "1", "2"], steps
    straggler = [
        s
        for s in families["torchrun_operator_job_straggler"].samples
        if s.labels["job"] == "progress-live"
    ]
    assert [s.value for s in straggler] == [1.0]

    done = wait_phase(kube, namespace, "progress-live", {"Succeeded", "Failed"}, timeout=200)
    final = done["status"]
    assert final["phase"] == "Succeeded", final.get("failure")
    assert final["progress"]["step"] == 90
    assert all(r["step"] == 90 for r in final["ranks"]), final["ranks"]


def test_a_hang_names_the_rank_outside_the_collective_and_its_line(
    kube: client.ApiClient, namespace: str
) -> None:
    # Global rank 1 hangs at step 4 before the step's barrier; the others wait in it.
    docs = script_job("hangs", 2, 1, STEPS="400", STEP_SLEEP="0.2", HANG_RANK="1", HANG_AT_STEP="4")
    # The clock starts at the rendezvous, before the workers import torch: 15 s was once too
    # short for rank 0's import on a loaded machine (it was named, stalled at the import).
    docs[1]["spec"]["runPolicy"] = {"progressTimeoutSeconds": 30, "cleanPodPolicy": "KeepAll"}
    started = time.monotonic()
    apply(kube, namespace, docs)
    # The gang's start, its steps up to the hang, then the progress timeout.
    budget = pace.attempts() + 4 * 0.2 + 30
    done = wait_phase(kube, namespace, "hangs", {"Succeeded", "Failed"}, timeout=budget)
    status = done["status"]
    assert status["phase"] == "Failed", status
    failure = status["failure"]
    assert (failure["reason"], failure["kind"]) == ("ProgressStalled", "stalled"), failure
    line = next(i + 1 for i, text in enumerate(TRAIN.splitlines()) if "# HANG" in text)
    assert failure["rank"] == 1, failure
    assert failure["location"] == f"/workspace/train.py:{line} in <module>", failure
    holder = next(r for r in status["ranks"] if r.get("globalRanks") == "1")
    assert (failure["index"], failure["pod"]) == (holder["index"], holder["pod"])
    assert failure["nodeRank"] == holder["nodeRank"]
    assert failure["message"].startswith(
        f"rank 1 (pod {holder['pod']}) is not inside a collective at /workspace/train.py:{line}"
    ), failure["message"]
    assert "while other ranks wait in one" in failure["message"]
    assert failure["step"] == 3
    # The full stacks are in the pod logs: the hung rank's, and the others' in the barrier.
    text = {r["pod"]: pod_log(kube, namespace, r["pod"]) for r in status["ranks"]}
    assert "stacks of a stalled rank" in text[holder["pod"]]
    assert f'File "/workspace/train.py", line {line} in <module>' in text[holder["pod"]]
    other = next(p for p in text if p != holder["pod"])
    assert "in barrier" in text[other], text[other][-3000:]
    print(f"\nhang named after {time.monotonic() - started:.0f} s: {failure['message']}")
