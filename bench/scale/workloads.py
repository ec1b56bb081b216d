"""The benchmark's workloads and the equivalent job manifests for each operator. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RUN_SECONDS = "bench.torchrun.dev/run-seconds"  # KWOK: Running -> Succeeded after this long
FAIL_EXIT_CODE = "bench.torchrun.dev/fail-exit-code"  # KWOK: Running -> Failed with this code
IMAGE = "pytorch/pytorch:2.15.0-cuda12.8-cudnn9-runtime"  # never pulled: KWOK runs nothing
GPUS_PER_NODE = 8

OURS = "torchrun-operator"
KUBEFLOW = "training-operator"
TRAINER = "trainer-v2"  # Kubeflow Trainer v2 + JobSet
DIRECT = "direct"
OPERATORS = [OURS, KUBEFLOW, TRAINER]  # the kinds with an operator, in table order

OURS_JOB_LABEL = "torchrun.dev/job-name"
KUBEFLOW_JOB_LABEL = "training.kubeflow.org/job-name"
TRAINER_JOB_LABEL = "jobset.sigs.k8s.io/jobset-name"  # the JobSet is named as its TrainJob
TRAINER_RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime of Trainer's manifests
# Owner of the TrainJob's runtimePatches entry (Trainer wants a domain-prefixed path).
BENCH_PATCH_MANAGER = "bench.torchrun.dev/scale"


@dataclass(frozen=True)
class Workload:
    name: str
    jobs: int
    nodes: int  # pods per job
    run_seconds: int  # how long KWOK keeps each pod Running
    gang_restart: bool = False  # fail one pod once every pod runs; time the recovery

    @property
    def pods(self) -> int:
        return self.jobs * self.nodes

    def job_names(self) -> list[str]:
        width = len(str(self.jobs - 1))
        return [f"{self.name}-{i:0{width}d}" for i in range(self.jobs)]


FULL = [
    Workload("big", jobs=1, nodes=512, run_seconds=90, gang_restart=True),
    Workload("mid", jobs=100, nodes=8, run_seconds=30),
    Workload("small", jobs=500, nodes=1, run_seconds=30),
]
SMOKE = [
    Workload("big", jobs=1, nodes=8, run_seconds=10, gang_restart=True),
    Workload("mid", jobs=3, nodes=2, run_seconds=5),
    Workload("small", jobs=4, nodes=1, run_seconds=5),
]

# The scaling series: operator CPU and API requests per pod as the size grows, one gang job
# of N pods and N one-pod jobs. Short runs: what grows with the run time (watches, resyncs)
# is not what the series is after.
SERIES_GANG = "gang"  # one job of N pods
SERIES_SINGLES = "singles"  # N jobs of one pod
SERIES = [
    *(Workload(f"series-g{n}", jobs=1, nodes=n, run_seconds=15) for n in (64, 128, 256, 512)),
    *(Workload(f"series-s{n}", jobs=n, nodes=1, run_seconds=15) for n in (100, 250, 500)),
]
SMOKE_SERIES = [
    Workload("series-g4", jobs=1, nodes=4, run_seconds=5),
    Workload("series-s3", jobs=3, nodes=1, run_seconds=5),
]


def series_shape(w: Workload) -> str:
    return SERIES_GANG if w.jobs == 1 else SERIES_SINGLES


def _container(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": IMAGE,
        "command": ["python", "/workspace/train.py"],
        # A string: our operator fails to create pods from an integer quantity (reported).
        "resources": {"limits": {"nvidia.com/gpu": str(GPUS_PER_NODE)}},
    }


def _template(w: Workload, container: str) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {RUN_SECONDS: f"{w.run_seconds}s"}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [_container(container)]},
    }


def ours_job(w: Workload, name: str) -> dict[str, Any]:
    """A DistributedTrainingJob: `nodes` pods of 8 GPUs. Gang restarts start at once
    (no back-off), so the benchmark times the operator rather than a timer. Pods are kept
    once the job finished (KeepAll), as the PyTorchJobs' cleanPodPolicy None keeps theirs:
    our default (KeepFailed) would add a delete per pod that the others do not make."""
    return {
        "apiVersion": "torchrun.dev/v1alpha1",
        "kind": "DistributedTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "nodes": w.nodes,
            "nprocPerNode": "gpu",
            "failurePolicy": {"maxRestarts": 3, "backoffSeconds": 0},
            "runPolicy": {"cleanPodPolicy": "KeepAll"},
            "template": _template(w, "trainer"),
        },
    }


def kubeflow_job(w: Workload, name: str) -> dict[str, Any]:
    """The same job as a Kubeflow PyTorchJob: one Master plus nodes-1 Workers. restartPolicy
    ExitCode: a pod that fails with a retryable code (128+) is replaced, as our gang restart
    is triggered by one; gang scheduling is off in the operator."""
    replica = {"restartPolicy": "ExitCode", "template": _template(w, "pytorch")}
    specs: dict[str, Any] = {"Master": {"replicas": 1, **replica}}
    if w.nodes > 1:
        specs["Worker"] = {"replicas": w.nodes - 1, **replica}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {
            "nprocPerNode": str(GPUS_PER_NODE),
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 10},
            "pytorchReplicaSpecs": specs,
        },
    }


def trainer_job(w: Workload, name: str) -> dict[str, Any]:
    """The same job as a Kubeflow Trainer v2 TrainJob on the torch ClusterTrainingRuntime:
    `numNodes` pods (one indexed Job of the JobSet's `node` replicated job), the same image,
    command and GPU limit in the runtime's `node` container (`trainer`), and the pods' KWOK
    annotation and grace period through a runtimePatches entry (Trainer's way to set pod
    metadata). The restart policy lives in the runtime (trainer.py: bench_runtime)."""
    pod_patch = {
        "metadata": {"annotations": {RUN_SECONDS: f"{w.run_seconds}s"}},
        "spec": {"terminationGracePeriodSeconds": 0},
    }
    node = {"name": "node", "template": {"spec": {"template": pod_patch}}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": TRAINER_RUNTIME,
            },
            "trainer": {
                "numNodes": w.nodes,
                "image": IMAGE,
                "command": _container("node")["command"],
                "resourcesPerNode": _container("node")["resources"],
            },
            "runtimePatches": [
                {
                    "manager": BENCH_PATCH_MANAGER,
                    "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node]}}},
                }
            ],
        },
    }


def direct_pod(w: Workload, job: str, index: int) -> dict[str, Any]:
    """A bare pod shaped like the operators' (same container, resources and annotations)."""
    t = _template(w, "trainer")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{index}",
            "labels": {OURS_JOB_LABEL: job},
            "annotations": t["metadata"]["annotations"],
        },
        "spec": {**t["spec"], "restartPolicy": "Never"},
    }


def job_label(kind: str) -> str:
    return {KUBEFLOW: KUBEFLOW_JOB_LABEL, TRAINER: TRAINER_JOB_LABEL}.get(kind, OURS_JOB_LABEL)
