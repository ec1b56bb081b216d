"""The rank that never arrived, end to end on the local cluster (CPU, gloo): the rank of one
pod sleeps outside an all-reduce that the other pod's rank waits in, with a 5 s
init_process_group timeout. The waiting rank's gloo times out and its pod fails; the late
pod's launcher learns of it (its rendezvous store gone when the late pod is index 1; the
rendezvous the failed agent closed when it is index 0, the store's host) and dumps its
workers' stacks; status.failure names the late rank, where it was (file:line), the kind
gloo-timeout and what the other rank said. The GPU runs of the same script (NCCL) are
bench/gpu_failures.py's (bench/README.md).
"""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from dtj import IMAGE, REPO, SMALL, apply, wait_phase
from kubernetes import client

pytestmark = pytest.mark.usefixtures("operator")

WORKER = REPO / "bench" / "gpu_fail_worker.py"


@pytest.mark.parametrize("late", [1, 0])
def test_a_gloo_timeout_names_the_rank_outside_the_collective(
    kube: client.ApiClient, namespace: str, late: int
) -> None:
    name = f"gloo-timeout-{late}"
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
            "--index",
            str(late),
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
    rank = int(status["ranks"][late]["globalRanks"])  # the late pod's one rank
    other = 1 - rank
    assert (f["rank"], f["kind"], f["reason"]) == (rank, "gloo-timeout", "GlooTimeout"), f
    assert f["index"] == late and f["pod"].startswith(f"{name}-{late}"), f
    # The line the late rank sleeps on (bench/gpu_fail_worker.py), from its stacks.
    line = next(
        i + 1
        for i, text in enumerate(WORKER.read_text().splitlines())
        if "time.sleep(args.sleep)" in text
    )
    assert f["location"].endswith(f"{WORKER.name}:{line} in main"), f
    assert f["message"].startswith(f"rank {rank} (pod {f['pod']}) was not in the collective at"), f
    assert f"rank {other} failed" in f["message"], f
    assert "Timed out waiting 5000ms" in f["message"], f
    # Infrastructure (a restart might help), but no budget: the job fails saying so.
    assert status["phase"] == "Failed" and status["counters"]["infrastructureFailures"] == 1
