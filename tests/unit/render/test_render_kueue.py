"""The Workload a queued job is admitted through, and what admission puts into its pods."""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from torchrun_operator.render import kueue, render_pod


def job(**spec: Any) -> dict[str, Any]:
    """A job of 4 pods queued to team-a-queue, each asking 2 CPUs; `spec`: more of its spec."""
    return jobs.job(
        "train",
        nproc=1,
        command=["python", "t.py"],
        trainer={"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}},
        metadata={
            "namespace": "team-a",
            "uid": "3f1c",
            "labels": {kueue.QUEUE_LABEL: "team-a-queue"},
        },
        **{"nodes": 4, **spec},
    )


JOB = job()


def test_the_workload_asks_quota_for_every_pod_with_the_users_template() -> None:
    wl = kueue.render_workload(job())
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    assert wl["spec"]["queueName"] == "team-a-queue"
    [pod_set] = wl["spec"]["podSets"]
    assert pod_set["name"] == "workers" and pod_set["count"] == 4 and "minCount" not in pod_set
    assert pod_set["template"]["spec"] == JOB["spec"]["template"]["spec"]
    assert "active" not in wl["spec"]
    meta = wl["metadata"]
    assert meta["namespace"] == "team-a"
    [owner] = meta["ownerReferences"]
    assert owner["uid"] == "3f1c" and owner["controller"] is True
    assert owner["kind"] == "DistributedTrainingJob"
    assert meta["labels"]["torchrun.dev/job-name"] == "train"
    assert meta["labels"][kueue.JOB_UID_LABEL] == "3f1c"


def test_an_elastic_job_reserves_its_maximum_and_may_be_admitted_partially() -> None:
    wl = kueue.render_workload(job(nodes=2, elastic={"minNodes": 1, "maxNodes": 3}))
    [pod_set] = wl["spec"]["podSets"]
    assert pod_set["count"] == 3 and pod_set["minCount"] == 1


def test_workload_names_follow_the_uid_so_a_recreated_job_never_meets_its_predecessor() -> None:
    other = job()
    other["metadata"]["uid"] = "9e2a"
    assert kueue.workload_name(job()) == kueue.workload_name(job())
    assert kueue.workload_name(job()) != kueue.workload_name(other)
    assert kueue.workload_name(job()).startswith("dtj-train-")
    long = job()
    long["metadata"]["name"] = "x" * 253
    assert len(kueue.workload_name(long)) <= 253


def test_the_spec_hash_changes_with_what_kueue_reserves_not_with_activation() -> None:
    base = kueue.spec_hash(kueue.render_workload(job()))
    assert kueue.spec_hash(kueue.render_workload(job(), active=False)) == base
    assert kueue.spec_hash(kueue.render_workload(job(nodes=2))) != base
    moved = job()
    moved["metadata"]["labels"][kueue.QUEUE_LABEL] = "other"
    assert kueue.spec_hash(kueue.render_workload(moved)) != base


def test_a_suspended_job_gets_a_workload_that_we_marked_deactivated() -> None:
    wl = kueue.render_workload(job(), active=False)
    assert wl["spec"]["active"] is False
    assert wl["metadata"]["annotations"][kueue.DEACTIVATED_ANNOTATION] == "true"


def test_the_priority_class_a_job_names_sets_the_workloads_priority() -> None:
    plain = kueue.render_workload(job())
    assert "priorityClassRef" not in plain["spec"] and "priority" not in plain["spec"]
    high = job()
    high["metadata"]["labels"][kueue.PRIORITY_LABEL] = "high"
    wl = kueue.render_workload(high, priority=1000)
    assert wl["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    assert wl["spec"]["priority"] == 1000
    # Fixed at creation, as in Kueue's integrations: no new Workload for it.
    assert kueue.spec_hash(wl) == kueue.spec_hash(plain)


def test_no_workload_without_a_queue() -> None:
    plain = job()
    del plain["metadata"]["labels"]
    assert kueue.queue_name(plain) is None
    with pytest.raises(ValueError, match="queue-name"):
        kueue.render_workload(plain)


ADMITTED: dict[str, Any] = {
    "metadata": {"name": "dtj-train-x"},
    "status": {
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "workers", "flavors": {"cpu": "spot", "memory": "spot", "gpu": "a100"}}
            ],
        },
        "admissionChecks": [
            {
                "name": "prov",
                "podSetUpdates": [
                    {"name": "workers", "annotations": {"prov/req": "r1"}, "labels": {"l": "v"}}
                ],
            }
        ],
    },
}
FLAVORS: dict[str, Any] = {
    "spot": {
        "spec": {
            "nodeLabels": {"cloud/spot": "true"},
            "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        }
    },
    "a100": {"spec": {"nodeLabels": {"gpu": "a100"}}},
}


def test_admission_puts_the_flavors_node_labels_and_tolerations_into_every_pod() -> None:
    assert kueue.assigned_flavors(ADMITTED) == ["spot", "a100"]
    info = kueue.pod_set_info(ADMITTED, FLAVORS)
    assert info["nodeSelector"] == {"cloud/spot": "true", "gpu": "a100"}
    assert info["tolerations"] == FLAVORS["spot"]["spec"]["tolerations"]
    assert info["labels"] == {kueue.PODSET_LABEL: "workers", "l": "v"}
    assert info["annotations"] == {"prov/req": "r1"}
    admitted = kueue.with_pod_set_info(job(), info)
    pod = render_pod(admitted, 1, 0)
    assert pod["spec"]["nodeSelector"] == {"cloud/spot": "true", "gpu": "a100"}
    assert pod["spec"]["tolerations"] == FLAVORS["spot"]["spec"]["tolerations"]
    assert pod["metadata"]["labels"][kueue.PODSET_LABEL] == "workers"
    assert pod["metadata"]["annotations"] == {"prov/req": "r1"}
    # The job object itself is never changed.
    assert "nodeSelector" not in JOB["spec"]["template"]["spec"]


def test_the_admission_wins_over_the_template_on_a_node_selector_key() -> None:
    own = job()
    own["spec"]["template"]["spec"]["nodeSelector"] = {"gpu": "h100", "zone": "a"}
    info = kueue.pod_set_info(ADMITTED, FLAVORS)
    pod = render_pod(kueue.with_pod_set_info(own, info), 0, 0)
    assert pod["spec"]["nodeSelector"] == {"gpu": "a100", "zone": "a", "cloud/spot": "true"}
