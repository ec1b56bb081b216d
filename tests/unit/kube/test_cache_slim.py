"""The pod cache keeps only what the operator reads of a pod, and nothing it reads is lost."""

from __future__ import annotations

import copy
import json
from typing import Any

import jobs
import reports
from torchrun_operator.api.names import ANNOTATION_LAST_APPLIED as LAST_APPLIED
from torchrun_operator.kube.cache import JobCache, PodCache, slim_job, slim_pod
from torchrun_operator.kube.readschedule import targets_of
from torchrun_operator.reconcile.admission import pods_left
from torchrun_operator.reconcile.observe import view
from torchrun_operator.render import render_pod


def api_pod(phase: str, *, failed: bool = False, avoid: tuple[str, ...] = ()) -> dict[str, Any]:
    """A rendered pod as the API returns it: defaults, managedFields, a status."""
    job = jobs.job("big", nodes=4, metadata={"namespace": "ns", "uid": "job-uid"})
    job["spec"]["template"]["metadata"] = {"annotations": {"team": "vision"}}
    pod = copy.deepcopy(render_pod(job, 1, 0, avoid_nodes=avoid))
    pod["metadata"].update(
        namespace="ns",
        uid="pod-uid",
        resourceVersion="42",
        creationTimestamp="2026-11-26T10:00:00Z",
        managedFields=[{"manager": "torchrun-operator", "fieldsV1": {"f:spec": {}}}],
    )
    pod["spec"]["nodeName"] = "node-7"
    term = {"exitCode": 1, "reason": "Error", "message": reports.report("Failed", ranks=[4, 5])}
    state = {"terminated": term} if failed else {"running": {"startedAt": "2026-11-26T10:00:05Z"}}
    pod["status"] = {
        "phase": phase,
        "podIP": "10.1.2.3",
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-26T10:00:06Z"}
        ],
        "containerStatuses": [{"name": "trainer", "state": state}],
    }
    return pod


def test_every_reader_sees_the_same_pod_through_the_slim_cache() -> None:
    for pod in (
        api_pod("Running"),
        api_pod("Failed", failed=True),
        api_pod("Pending", avoid=("node-2", "node-5")),
    ):
        c = PodCache(keep=slim_pod)
        key = c.put(copy.deepcopy(pod))
        assert key is not None
        (kept,) = c.pods(key)
        assert view(kept, "trainer") == view(pod, "trainer")
        assert targets_of([kept], 0) == targets_of([pod], 0)
        assert pods_left([kept], "job-uid") == pods_left([pod], "job-uid") == 1
        assert kept["metadata"]["uid"] == "pod-uid"
    # Of the annotations, the cache keeps the one the reconciler reads.
    kept = slim_pod(api_pod("Pending", avoid=("node-2",)))
    assert kept["metadata"]["annotations"] == {"torchrun.dev/avoided-nodes": "node-2"}
    assert view(kept, "trainer").avoided == {"node-2"}
    assert "annotations" not in slim_pod(api_pod("Running"))["metadata"]


def test_the_slim_pod_is_a_fraction_of_the_api_object() -> None:
    pod = api_pod("Running")
    slim = slim_pod(pod)
    assert "managedFields" not in slim["metadata"] and "containers" not in slim["spec"]
    assert len(json.dumps(slim)) < len(json.dumps(pod)) / 3


def test_objects_are_kept_whole_by_default() -> None:
    pod = api_pod("Running")
    c = PodCache()
    key = c.put(pod)
    assert key is not None and c.pods(key) == [pod]


def test_the_job_cache_keeps_no_managed_fields_nor_last_applied_copy() -> None:
    job = jobs.job("big", nodes=4, metadata={"namespace": "ns", "uid": "job-uid"})
    job["metadata"].update(
        resourceVersion="7",
        annotations={LAST_APPLIED: json.dumps(job), "team": "vision"},
        managedFields=[{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:nodes": {}}}}],
    )
    job["status"] = {"phase": "Running", "attempt": 0}
    c = JobCache()
    c.put(job)
    kept = c.get(("ns", "big"))
    assert kept is not None
    assert "managedFields" not in kept["metadata"]
    assert kept["metadata"]["annotations"] == {"team": "vision"}
    assert kept["spec"] == job["spec"] and kept["status"] == job["status"]
    assert {k: v for k, v in kept["metadata"].items() if k != "annotations"} == {
        k: v for k, v in job["metadata"].items() if k not in ("annotations", "managedFields")
    }
    assert LAST_APPLIED in job["metadata"]["annotations"]  # the given object is unchanged
    assert len(json.dumps(kept)) < len(json.dumps(job)) / 1.5


def test_a_job_with_nothing_to_drop_is_kept_as_given() -> None:
    job = jobs.job("small", metadata={"namespace": "ns", "uid": "u", "resourceVersion": "1"})
    assert slim_job(job) is job
