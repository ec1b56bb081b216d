"""The rank that never arrived, end to end on the local cluster (CPU, gloo): rank 1 sleeps
outside an all-reduce that rank 0 waits in, with a 5 s init_process_group timeout. Rank 0's
gloo times out; its launcher, and rank 1's in the other pod (its rendezvous store gone), dump
their workers' stacks; status.failure names rank 1, where it was (file:line), the kind
gloo-timeout and what rank 0 said. The GPU runs of the same script (NCCL) are
bench/gpu_failures.py's (bench/README.md).
"""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from dtj import IMAGE, REPO, SMALL, apply, wait_phase
from kubernetes import client

pytestmark = [pytest.mark.localkube, pytest.mark.usefixtures("operator")]

WORKER = REPO / "bench" / "gpu_fail_worker.py"


def test_a_gloo_timeout_names_the_rank_outside_the_collective(
    kube: client.ApiClient, namespace: str
) -> None:
    name = "gloo-timeout"
    docs = jobs.scripted(
        name,
        {WORKER.name: WORKER.read_text()},
        [
            "python",
            f"{jobs.WORKSPACE}/{WORKER.name}",
            "--mode",
            "nccl-timeout",
            "--backend",
            "gloo",
            "--rank",
            "1",
            "--timeout",
            "5",
            "--sleep",
            "300",
        ],
        nodes=2,
        nproc=1,
        image=IMAGE,
        trainer={"resources": SMALL},
        pod={"terminationGracePeriodSeconds": 2},
        rendezvous={"joinTimeoutSeconds": 90},
        failurePolicy={"maxRestarts": 0},
    )
    apply(kube, namespace, docs)
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=240)
    status: dict[str, Any] = done["status"]
    f = status["failure"]
    assert (f["rank"], f["kind"], f["reason"]) == (1, "gloo-timeout", "GlooTimeout"), f
    assert f["index"] == 1 and f["pod"].startswith(f"{name}-1"), f
    # The line rank 1 sleeps on (bench/gpu_fail_worker.py), from its stacks.
    line = next(
        i + 1
        for i, text in enumerate(WORKER.read_text().splitlines())
        if "time.sleep(args.sleep)" in text
    )
    assert f["location"].endswith(f"{WORKER.name}:{line} in main"), f
    assert f["message"].startswith(f"rank 1 (pod {f['pod']}) was not in the collective at"), f
    assert "rank 0 failed" in f["message"] and "Timed out waiting 5000ms" in f["message"], f
    # Infrastructure (a restart might help), but no budget: the job fails saying so.
    assert status["phase"] == "Failed" and status["counters"]["infrastructureFailures"] == 1
