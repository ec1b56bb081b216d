"""A crash loop ends early: an attempt that dies like the one before it, no further along,
fails the job as CrashLoopNoProgress instead of spending the rest of maxRestarts."""

from __future__ import annotations

import pace
import pytest
from dtj import apply, wait_phase
from kubernetes import client
from test_rankmap import script_job

pytestmark = pytest.mark.usefixtures("operator")


def test_a_rank_killed_at_the_same_step_twice_is_a_crash_loop(
    kube: client.ApiClient, namespace: str
) -> None:
    # Global rank 0 is SIGKILLed (as by a segfault or the OOM killer) at step 3 of every
    # attempt: an infrastructure failure, which restarts the gang, until the second attempt
    # fails the same way without getting further than the first.
    docs = script_job("crashloop", 2, 2, STEPS="20", STEP_SLEEP="0.3", FAIL_AT_STEP="3")
    job = docs[1]
    job["spec"]["failurePolicy"] = {"maxRestarts": 5, "backoffSeconds": 1}
    apply(kube, namespace, docs)
    # Two attempts of two pods of two workers, each killed at step 3 (0.3 s a step).
    budget = pace.attempts(2, pods=2, nproc=2) + 2 * 3 * 0.3
    done = wait_phase(kube, namespace, "crashloop", {"Succeeded", "Failed"}, timeout=budget)
    status = done["status"]
    assert status["phase"] == "Failed", status
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "CrashLoopNoProgress", failed
    assert "attempt 1 failed at step 2, no further than attempt 0 (step 2)" in failed["message"]
    assert status["attempt"] == 1 and status["counters"]["restarts"] == 1, status
    (record,) = status["restarts"]
    assert record["step"] == 2 and record["kind"] == "infrastructure"
    assert record["signature"].startswith("signal/Signal/-9"), record
    failure = status["failure"]
    assert (failure["kind"], failure["rank"], failure["step"]) == ("signal", 0, 2), failure
    # The index and torchrun's node rank of the pod that held rank 0 are both named.
    holder = next(r for r in status["ranks"] if r.get("globalRanks") == "0-1")
    assert failure["index"] == holder["index"] and failure["nodeRank"] == holder["nodeRank"] == 0
