"""The benchmark's Kubeflow Trainer v2 + JobSet comparison, its pure parts: the TrainJob, the
runtime's restart policy, the webhook configurations and controller configurations derived
from the modules' manifests, reading their status, and the scaling series' points."""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402
import yaml  # noqa: E402

from bench.scale import report, series  # noqa: E402
from bench.scale.figures import PodObs, compute, job_obs, jobset_obs, status_lags  # noqa: E402
from bench.scale.trainer import (  # noqa: E402
    MAX_RESTARTS,
    bench_runtime,
    jobset_config,
    json_patch,
    kustomized_webhooks,
    local_webhooks,
    trainer_config,
)
from bench.scale.workloads import (  # noqa: E402
    GPUS_PER_NODE,
    IMAGE,
    KUBEFLOW,
    OURS,
    RUN_SECONDS,
    SERIES,
    TRAINER,
    TRAINER_RUNTIME,
    Workload,
    job_label,
    ours_job,
    trainer_job,
)


def test_trainjob_is_the_same_job_on_the_torch_runtime() -> None:
    w = Workload("mid", jobs=2, nodes=8, run_seconds=30)
    job = trainer_job(w, "mid-0")
    assert job["kind"] == "TrainJob" and job["metadata"]["name"] == "mid-0"
    spec = job["spec"]
    assert spec["runtimeRef"]["name"] == TRAINER_RUNTIME
    assert spec["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    ours = ours_job(w, "x")["spec"]["template"]["spec"]["containers"][0]
    assert spec["trainer"]["numNodes"] == 8
    assert spec["trainer"]["image"] == IMAGE == ours["image"]
    assert spec["trainer"]["command"] == ours["command"]
    assert spec["trainer"]["resourcesPerNode"] == ours["resources"]
    assert ours["resources"]["limits"]["nvidia.com/gpu"] == str(GPUS_PER_NODE)
    (patch,) = spec["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    pod = rjob["template"]["spec"]["template"]
    assert pod["metadata"]["annotations"] == {RUN_SECONDS: "30s"}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 0
    assert job_label(TRAINER) == "jobset.sigs.k8s.io/jobset-name"


RUNTIME: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed"},
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
            "spec": {"template": {"spec": {"containers": [{"name": "node"}]}}}}}]}},
    },
}  # fmt: skip


def test_runtime_gets_a_gang_restart_policy_and_nothing_else() -> None:
    got = bench_runtime(RUNTIME)
    jobset = got["spec"]["template"]["spec"]
    assert jobset["failurePolicy"] == {"maxRestarts": MAX_RESTARTS}
    assert jobset["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] == 0
    assert "failurePolicy" not in RUNTIME["spec"]["template"]["spec"]  # a copy
    del jobset["failurePolicy"], jobset["replicatedJobs"][0]["template"]["spec"]["backoffLimit"]
    assert got == RUNTIME


def test_json_patch_add_and_replace_only() -> None:
    doc: dict[str, Any] = {"metadata": {"name": "a"}, "webhooks": [{"n": 0}, {"n": 1}]}
    got = json_patch(doc, [
        {"op": "replace", "path": "/metadata/name", "value": "b"},
        {"op": "add", "path": "/webhooks/1/objectSelector", "value": {"x": 1}},
        {"op": "replace", "path": "/webhooks/0", "value": {"n": 9}},
        {"op": "add", "path": "/webhooks/-", "value": {"n": 2}},
    ])  # fmt: skip
    hooks = [{"n": 9}, {"n": 1, "objectSelector": {"x": 1}}, {"n": 2}]
    assert got == {"metadata": {"name": "b"}, "webhooks": hooks}
    assert doc["metadata"]["name"] == "a"
    with pytest.raises(ValueError):
        json_patch(doc, [{"op": "remove", "path": "/metadata"}])
    with pytest.raises(ValueError):
        json_patch(doc, [{"op": "replace", "path": "/spec", "value": 1}])


def _hook(name: str, path: str) -> dict[str, object]:
    return {"name": name, "failurePolicy": "Fail",
            "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                         "path": path}}}  # fmt: skip


def test_webhooks_as_the_kustomization_renders_them_then_called_on_the_host(
    tmp_path: Path,
) -> None:
    mutating = {"apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "mutating-webhook-configuration"},
                "webhooks": [_hook("mjobset.kb.io", "/mutate-jobset"),
                             _hook("mpod.kb.io", "/mutate--v1-pod")]}  # fmt: skip
    validating = {**mutating, "kind": "ValidatingWebhookConfiguration",
                  "metadata": {"name": "validating-webhook-configuration"},
                  "webhooks": [_hook("vjobset.kb.io", "/validate-jobset")]}  # fmt: skip
    (tmp_path / "manifests.yaml").write_text(yaml.safe_dump_all([mutating, validating]))
    selector = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name",
                                      "operator": "Exists"}]}  # fmt: skip
    pod_hook = {**_hook("mpod.kb.io", "/mutate--v1-pod"), "objectSelector": selector}
    (tmp_path / "mutating-patch.yaml").write_text(
        yaml.safe_dump([{"op": "replace", "path": "/webhooks/1", "value": pod_hook}])
    )
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["manifests.yaml", "service.yaml"],
        "patches": [{"path": "mutating-patch.yaml", "target": {
            "kind": "MutatingWebhookConfiguration", "name": "mutating-webhook-configuration"}}],
    }))  # fmt: skip
    docs = kustomized_webhooks(tmp_path)
    assert [d["kind"] for d in docs] == [mutating["kind"], validating["kind"]]
    assert docs[0]["webhooks"][1]["objectSelector"] == selector
    assert "objectSelector" not in docs[1]["webhooks"][0]

    got = local_webhooks(docs, 9443, b"CA PEM", "bench-jobset-")
    assert got[0]["metadata"] == {"name": "bench-jobset-mutating-webhook-configuration"}
    hook = got[0]["webhooks"][1]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate--v1-pod",
        "caBundle": base64.b64encode(b"CA PEM").decode(),
    }
    assert hook["objectSelector"] == selector and hook["failurePolicy"] == "Fail"


def test_controller_configs_change_only_what_a_host_process_needs(tmp_path: Path) -> None:
    ports = {"health": 1, "metrics": 2, "webhook": 3}
    release = {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081", "readinessEndpointName": "readyz"},
        "metrics": {"bindAddress": ":8443", "secureServing": True},
        "webhook": {"port": 9443, "host": ""},
        "leaderElection": {"leaderElect": True, "resourceName": "trainer.kubeflow.org"},
        "controller": {"groupKindConcurrency": {"TrainJob.trainer.kubeflow.org": 5}},
        "certManagement": {"enable": True, "webhookServiceName": "svc"},
        "clientConnection": {"qps": 50, "burst": 100},
    }  # fmt: skip
    t = trainer_config(release, ports)
    assert t["health"] == {
        "healthProbeBindAddress": "127.0.0.1:1",
        "readinessEndpointName": "readyz",
    }
    assert t["metrics"] == {"bindAddress": "127.0.0.1:2", "secureServing": True}
    assert t["webhook"] == {"port": 3, "host": "127.0.0.1"}
    assert t["leaderElection"]["leaderElect"] is False
    assert t["certManagement"]["enable"] is False
    assert t["controller"] == release["controller"]
    assert t["clientConnection"] == release["clientConnection"]
    assert release["webhook"] == {"port": 9443, "host": ""}  # a copy

    jrelease = {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
                "leaderElection": {"leaderElect": True},
                "internalCertManagement": {"enable": True}}  # fmt: skip
    j = jobset_config(jrelease, ports, tmp_path)
    assert j["webhook"] == {"port": 3, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert j["metrics"] == {"bindAddress": "127.0.0.1:2", "certDir": str(tmp_path)}
    assert j["health"] == {"healthProbeBindAddress": "127.0.0.1:1"}
    assert j["leaderElection"] == {"leaderElect": False}
    assert j["internalCertManagement"] == {"enable": False}
    assert "clientConnection" not in j  # JobSet's defaults (QPS 500 / burst 500)


def trainjob(nodes: int, jobs_status: list[dict[str, int]], *conds: str) -> dict[str, object]:
    return {
        "metadata": {"name": "w-0"},
        "spec": {"trainer": {"numNodes": nodes}},
        "status": {"jobsStatus": [{"name": "node", **s} for s in jobs_status],
                   "conditions": [{"type": c, "status": "True"} for c in conds]},
    }  # fmt: skip


def test_trainjob_status_counts_pods_in_steps_of_its_job() -> None:
    o = job_obs(1.0, TRAINER, trainjob(8, [{"ready": 0, "active": 1}]))
    assert (o.running, o.started, o.finished, o.step) == (False, 0, 0, 8)
    o = job_obs(1.0, TRAINER, trainjob(8, [{"ready": 1, "active": 1}]))
    assert (o.running, o.succeeded, o.started, o.finished) == (True, False, 8, 0)
    o = job_obs(1.0, TRAINER, trainjob(8, [{"ready": 0, "succeeded": 1}], "Complete"))
    assert (o.running, o.succeeded, o.started, o.finished) == (False, True, 8, 8)
    o = job_obs(1.0, TRAINER, trainjob(8, [{"failed": 1}], "Failed"))
    assert (o.failed, o.started, o.finished) == (True, 8, 8)
    assert not job_obs(1.0, TRAINER, {"metadata": {"name": "w-0"}}).running
    js = jobset_obs(2.0, {"metadata": {"name": "w-0"}, "status": {"restarts": 1}})
    assert js.restarting and not jobset_obs(2.0, {"metadata": {"name": "w-0"}}).restarting


def pod(t: float, uid: str, phase: str) -> PodObs:
    return PodObs(t, uid, f"pod-{uid}", "w-0", phase, deleting=False, gone=False)


def test_status_lag_of_a_stepped_status_samples_only_whole_steps() -> None:
    pods = [pod(1.0, "a", "Running"), pod(2.0, "b", "Running"),
            pod(5.0, "a", "Succeeded"), pod(6.0, "b", "Succeeded")]  # fmt: skip
    jobs = [
        job_obs(2.5, TRAINER, trainjob(2, [{"ready": 1}])),
        job_obs(7.0, TRAINER, trainjob(2, [{"succeeded": 1}], "Complete")),
    ]
    lags, missed = status_lags(pods, jobs)
    assert sorted(lags) == [0.5, 1.0] and missed == 0  # the 2nd pod to start, to finish


def test_trainer_restart_is_read_from_the_jobset() -> None:
    w = Workload("w", jobs=1, nodes=2, run_seconds=1, gang_restart=True)
    pods = [pod(1.0, "a", "Running"), pod(1.0, "b", "Running"), pod(3.0, "b", "Failed"),
            PodObs(3.5, "a", "pod-a", "w-0", "Running", deleting=True, gone=False),
            pod(5.0, "c", "Running"), pod(6.0, "d", "Running"),
            pod(9.0, "c", "Succeeded"), pod(9.0, "d", "Succeeded")]  # fmt: skip
    jobs = [job_obs(2.0, TRAINER, trainjob(2, [{"ready": 1}])),
            job_obs(9.5, TRAINER, trainjob(2, [{"succeeded": 1}], "Complete"))]  # fmt: skip
    meta = {"name": "w-0"}
    restarts = [jobset_obs(1.5, {"metadata": meta}),
                jobset_obs(4.0, {"metadata": meta, "status": {"restarts": 1}})]  # fmt: skip
    out = compute(w, TRAINER, pods, jobs, 0.0, "b", restarts)
    assert out["restart_s"] == pytest.approx(3.0)
    assert out["restart_status_noticed_s"] == pytest.approx(1.0)
    assert out["restart_pods_replaced"] == 2
    assert out["jobs_succeeded"] == 1 and out["finish_lag_max_s"] == pytest.approx(0.5)


def test_table_has_a_trainer_column_and_its_ratio() -> None:
    w = Workload("w", jobs=1, nodes=2, run_seconds=1)
    results = {OURS: {"cpu_s": 2.0}, KUBEFLOW: {"cpu_s": 1.0}, TRAINER: {"cpu_s": 3.0}}
    row = next(r for r in report.rows(w, results) if r[0].startswith("operator CPU"))
    assert row[1:6] == ("2.00", "1.00", "0.50x", "3.00", "1.50x")
    assert len(row) == len(report.HEADER)
    row = report.rows(w, {OURS: {"cpu_s": 2.0}})[0]
    assert row[2] == row[4] == "not run"


def test_series_points_are_per_pod_by_shape_and_in_order() -> None:
    loads = [Workload("g2", 1, 2, 1), Workload("g1", 1, 1, 1), Workload("s3", 3, 1, 1)]
    results = {
        "g2": {OURS: {"cpu_s": 4.0, "api_requests": 10}, TRAINER: {"cpu_s": 1.0}},
        "g1": {OURS: {"cpu_s": 3.0, "api_requests": 7}},
        "s3": {OURS: {"cpu_s": 3.0, "api_requests": 30}, "direct": {"cpu_s": 1.0}},
    }
    pts = series.points(results, loads)
    assert pts[OURS]["gang"] == {
        "cpu_s": [(1, 3.0), (2, 2.0)],
        "api_requests": [(1, 7.0), (2, 5.0)],
    }
    assert pts[OURS]["singles"] == {"cpu_s": [(3, 1.0)], "api_requests": [(3, 10.0)]}
    assert pts[TRAINER] == {"gang": {"cpu_s": [(2, 0.5)]}}  # no API figure: left out
    assert "direct" not in pts
    labels = {OURS: "ours", KUBEFLOW: "kf", TRAINER: "tv2"}
    table = series.markdown_table(results, loads, labels)
    assert "| 1 job x 2 pods | 2.00 | 0.500 | 5.00 | n/a |" in table
    assert "| 3 jobs x 1 pod | 1.00 | n/a | 10.0 | n/a |" in table


def test_the_series_spans_the_sizes_asked_for() -> None:
    assert sorted(w.nodes for w in SERIES if w.jobs == 1) == [64, 128, 256, 512]
    assert sorted(w.jobs for w in SERIES if w.nodes == 1) == [100, 250, 500]
    assert all(10 <= w.run_seconds <= 20 for w in SERIES)
