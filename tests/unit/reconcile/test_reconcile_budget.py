"""The status stays under its budget at the largest job the API admits, every rank failed
with the longest messages, and the root cause is kept whole."""

from __future__ import annotations

import copy
import json

from dtj_factory import at, failure, make_job, set_terminated, start
from reports import report
from torchrun_operator.api.models import MAX_NODES, JobStatus
from torchrun_operator.reconcile import reconcile
from torchrun_operator.reconcile.budget import STATUS_BUDGET_BYTES, bound, size

NPROC = 8
LONG = "RuntimeError: " + "x" * 4000  # the launcher's messages are longer than we keep


def test_largest_job_every_rank_failed_fits_the_budget() -> None:
    job = make_job(nodes=MAX_NODES, nprocPerNode=NPROC, failurePolicy={"maxRestarts": 0})
    job, pods = start(job)
    failed = []
    for i, pod in enumerate(pods):
        pod = copy.deepcopy(pod)
        pod["spec"]["nodeName"] = f"gpu-node-{i:05d}.rack-{i // 32:03d}.cluster.example.com"
        ranks = list(range(i * NPROC, (i + 1) * NPROC))
        fails = [failure(r, "exception", 5 + r * 1e-6, LONG) for r in ranks]
        failed.append(set_terminated(pod, 1, report("Failed", ranks, fails), t=10))
    plan = reconcile(job, failed, at(60))
    st = plan.status
    assert st["phase"] == "Failed"
    assert size(st) <= STATUS_BUDGET_BYTES < 1024 * 1024 + 1
    JobStatus.model_validate(st)
    assert len(st["ranks"]) == MAX_NODES
    # The root cause is whole: the same as a small status would carry.
    assert st["failure"]["rank"] == 0 and st["failure"]["message"].startswith("RuntimeError")
    assert len(json.dumps(st["failure"])) < 2048


def test_small_status_is_left_alone() -> None:
    status = {"ranks": [{"nodeRank": 0, "message": "m" * 500}], "phase": "Failed"}
    assert bound(copy.deepcopy(status)) == status


def test_messages_shrink_before_fields_go() -> None:
    ranks = [{"nodeRank": i, "pod": f"p-{i}", "message": "m" * 400} for i in range(4000)]
    status = {"ranks": ranks, "failure": {"message": "f" * 512}}
    out = bound(copy.deepcopy(status), budget=1_000_000)
    assert size(out) <= 1_000_000
    assert all(0 < len(r["message"]) < 400 for r in out["ranks"])
    assert out["failure"] == status["failure"]
