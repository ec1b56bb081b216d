"""A job on a training runtime (docs/runtimes.md): it waits, Pending, for a runtime that does not
exist; it records the runtime in its status in the very status that plans its first pods; its
pods carry the merged settings; and once recorded, the runtime as it is now never matters
again, neither to the running pods nor to the next gang restart."""

from __future__ import annotations

import copy
from typing import Any

import jobs
from dtj_factory import UID, apply, at, drop_terminating, set_running, set_terminated
from jobs import condition as cond
from torchrun_operator.reconcile import Plan, reconcile
from torchrun_operator.reconcile.core import SETTLE_SECONDS
from torchrun_operator.reconcile.runtimeref import (
    RUNTIME_RETRY_SECONDS,
    needs_lookup,
    resolve,
)

Obj = dict[str, Any]

NCCL = {"name": "NCCL_DEBUG", "value": "INFO"}


def gpu_runtime(**trainer: Any) -> Obj:
    rt = jobs.runtime(
        "gpu",
        trainer={
            "image": "runtime-image",
            "env": [NCCL, {"name": "NCCL_IB_HCA", "value": "mlx5"}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            **trainer,
        },
        pod={"volumes": [{"name": "data", "emptyDir": {}}], "tolerations": [{"key": "gpu"}]},
        nprocPerNode=2,
        failurePolicy={"maxRestarts": 5, "backoffSeconds": 0},
    )
    rt["metadata"].update(uid="rt-uid", resourceVersion="7")
    return rt


def ten_line_job(**trainer: Any) -> Obj:
    return jobs.on_runtime(
        "job",
        "gpu",
        trainer={"command": ["python", "t.py"], "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}
        | trainer,
        metadata={"namespace": "ns", "uid": UID, "generation": 1},
        status={},
    )


def run(job: Obj, pods: list[Obj], t: float, runtime: Obj | None) -> tuple[Plan, Obj, list[Obj]]:
    """One reconcile as the controller does it: the runtime read only while needs_lookup
    says so (else whatever `runtime` is now, the shell does not look), then resolve."""
    found = runtime if needs_lookup(job) else None
    resolved = resolve(job, found)
    plan = reconcile(resolved.job, pods, at(t), runtime=resolved)
    job2, pods2 = apply(job, pods, plan, t)
    return plan, job2, pods2


def trainer(pod: Obj) -> Obj:
    c: Obj = pod["spec"]["containers"][0]
    return c


def test_a_missing_runtime_leaves_the_job_pending_with_a_condition_naming_it() -> None:
    job = ten_line_job()
    plan, job, _ = run(job, [], 0, None)
    assert plan.status["phase"] == "Pending" and plan.create == []
    c = cond(plan.status, "RuntimeResolved")
    assert c["status"] == "False" and c["reason"] == "RuntimeNotFound"
    assert "ClusterDistributedTrainingRuntime gpu" in c["message"]
    assert plan.requeue_after == RUNTIME_RETRY_SECONDS
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "RuntimeNotFound")]
    # Said once: the next look finds it missing again, quietly.
    plan, _, _ = run(job, [], RUNTIME_RETRY_SECONDS, None)
    assert plan.events == [] and plan.create == []


def test_the_runtime_is_recorded_in_the_status_that_plans_the_first_pods() -> None:
    job = ten_line_job()
    _, job, _ = run(job, [], 0, None)  # not there yet
    plan, job, pods = run(job, [], 10, gpu_runtime())
    rec = plan.status["runtime"]
    assert (rec["kind"], rec["name"], rec["uid"], rec["resourceVersion"]) == (
        "ClusterDistributedTrainingRuntime",
        "gpu",
        "rt-uid",
        "7",
    )
    assert rec["spec"] == gpu_runtime()["spec"] and len(rec["specHash"]) == 16
    assert cond(plan.status, "RuntimeResolved")["status"] == "True"
    # The controller writes this status before it creates these pods (controller._apply).
    assert len(plan.create) == 2 and plan.status["phase"] == "Starting"
    pod = plan.create[0]
    t = trainer(pod)
    env = {e["name"]: e.get("value") for e in t["env"]}
    # The job's image is the runtime's, its command the job's; env merged by name, the job's
    # NCCL_DEBUG winning; the runtime's volume, mount and toleration are in the pod.
    assert env["NCCL_DEBUG"] == "WARN" and env["NCCL_IB_HCA"] == "mlx5"
    assert t["image"] == "runtime-image"
    assert {"name": "data", "mountPath": "/data"} in t["volumeMounts"]
    assert {"name": "data", "emptyDir": {}} in pod["spec"]["volumes"]
    assert {"key": "gpu"} in pod["spec"]["tolerations"]
    assert "--nproc-per-node 2" in " ".join(t["args"])
    assert plan.status["worldSize"] == 4


def test_an_edited_runtime_changes_nothing_in_the_job_nor_its_next_gang_restart() -> None:
    job = ten_line_job()
    _, job, pods = run(job, [], 0, gpu_runtime())
    first = copy.deepcopy(pods)
    edited = gpu_runtime(image="edited-image", env=[{"name": "NCCL_DEBUG", "value": "TRACE"}])
    edited["spec"]["failurePolicy"] = {"maxRestarts": 0}
    edited["metadata"]["resourceVersion"] = "8"
    pods = [set_running(p, ready=True) for p in pods]
    plan, job, pods = run(job, pods, 2, edited)
    assert plan.status["phase"] == "Running" and plan.create == [] and plan.delete == []
    assert plan.status["runtime"]["resourceVersion"] == "7"
    # A pod fails: the runtime's recorded maxRestarts (5) restarts the gang, not the edited 0.
    pods = [set_terminated(pods[0], 137, reason="OOMKilled", t=3), pods[1]]
    # Seen at 4, settled SETTLE_SECONDS later (restart decided, old pods deleted), then the
    # next attempt once they are gone (the runtime's backoffSeconds: 0).
    for t in (4, 4 + SETTLE_SECONDS, 5 + SETTLE_SECONDS):
        plan, job, pods = run(job, drop_terminating(pods), t, edited)
    assert job["status"]["attempt"] == 1 and len(plan.create) == 2
    for old, new in zip(first, plan.create, strict=True):
        assert trainer(new)["image"] == trainer(old)["image"] == "runtime-image"
        # The same environment, but for the attempt each pod belongs to.
        attempt = {"name": "TORCHRUN_OPERATOR_ATTEMPT", "value": "1"}
        was = [
            e if e["name"] != attempt["name"] else {**e, "value": "1"} for e in trainer(old)["env"]
        ]
        assert attempt in trainer(new)["env"] and trainer(new)["env"] == was
        assert new["spec"]["volumes"] == old["spec"]["volumes"]


def test_a_deleted_runtime_changes_nothing_either() -> None:
    job = ten_line_job()
    _, job, pods = run(job, [], 0, gpu_runtime())
    assert needs_lookup(job) is None  # recorded: the shell never reads it again
    plan, _, _ = run(job, [set_running(p) for p in pods], 2, None)
    assert plan.status["phase"] == "Running" and plan.create == []
    assert plan.status["runtime"]["uid"] == "rt-uid"


def test_an_invalid_merged_spec_fails_the_job_naming_the_field_and_its_origin() -> None:
    job = ten_line_job()
    rt = gpu_runtime()
    rt["spec"]["template"]["spec"]["containers"][0].pop("image")  # neither gives an image
    plan, _, _ = run(job, [], 0, rt)
    assert plan.status["phase"] == "Failed" and plan.create == []
    failed = cond(plan.status, "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert failed["message"] == (
        "spec.template.spec.containers[0].image (from the job merged onto the runtime "
        "ClusterDistributedTrainingRuntime gpu): Field required"
    )
    assert plan.status["runtime"]["name"] == "gpu"  # what made it invalid is on record


def test_a_bad_field_of_the_job_is_named_as_the_jobs() -> None:
    job = ten_line_job()
    job["spec"]["rendezvous"] = {"port": 29401}  # the launcher's status port
    plan, _, _ = run(job, [], 0, gpu_runtime())
    message = cond(plan.status, "Failed")["message"]
    assert message.startswith("spec.rendezvous (from the job): ")


def test_a_job_without_a_runtime_is_untouched() -> None:
    job = jobs.job("plain", metadata={"namespace": "ns", "uid": UID}, status={})
    assert needs_lookup(job) is None
    resolved = resolve(job, None)
    assert resolved.job is job and resolved.runtime is None
