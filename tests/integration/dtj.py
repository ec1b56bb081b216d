"""Helpers for integration tests that drive DistributedTrainingJobs through the real API."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jobs
import pace
import yaml
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity
from localkube.procs import free_port
from localkube.testing import wait_for
from torchrun_operator.api.names import GROUP, LABEL_JOB_NAME, PLURAL, VERSION

REPO = Path(__file__).resolve().parents[2]
JOB_LABEL = LABEL_JOB_NAME
# Not pulled on the local cluster (pods run with the test environment's Python and torch);
# the image a user would name.
IMAGE = "pytorch/pytorch:2.15.0-cuda12.8-cudnn9-runtime"
# What a small CPU trainer asks for, so that a node fits several.
SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}}


def quick_job(name: str, nodes: int = 2, **spec: Any) -> dict[str, Any]:
    """A job whose one worker per pod prints and exits 0."""
    return jobs.job(
        name,
        nodes=nodes,
        nproc=1,
        image=IMAGE,
        command=["python", "-c", "print('user program ran')"],
        trainer={"resources": SMALL},
        pod={"terminationGracePeriodSeconds": 2},
        **{"rendezvous": {"joinTimeoutSeconds": 90}, **spec},
    )


def load_docs(path: Path | str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(Path(path).read_text()) if d]


def apply(api: client.ApiClient, namespace: str, docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Creates every document in `namespace`; returns the DistributedTrainingJob."""
    job: dict[str, Any] | None = None
    for doc in docs:
        if doc["kind"] == "DistributedTrainingJob":
            job = create_job(api, namespace, doc)
        else:
            utils.create_from_dict(api, doc, namespace=namespace)
    assert job is not None, "manifest has no DistributedTrainingJob"
    return job


def create_job(api: client.ApiClient, namespace: str, doc: dict[str, Any]) -> dict[str, Any]:
    # Strict field validation, as `kubectl apply` does by default: unknown fields are errors.
    custom = client.CustomObjectsApi(api)
    result: Any = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, doc, field_validation="Strict"
    )
    return result


def get_job(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    result: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return result


def job_gone(api: client.ApiClient, namespace: str, name: str) -> bool:
    """Whether the job is no more (a 404; any other error raises)."""
    try:
        get_job(api, namespace, name)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


# What the examples' trainers do beyond starting (examples/cpu-ddp.yaml: train_ddp, 4 epochs of
# 512 samples, the cost of 8 epochs of pace's 256, with 0.05 s step sleeps): the default wait's
# allowance for a job's own work.
EXAMPLE_WORK_S = pace.train_ddp(8, 0.05)


def wait_phase(
    api: client.ApiClient,
    namespace: str,
    name: str,
    phases: set[str],
    timeout: float | None = None,
) -> dict[str, Any]:
    """The job once its phase is one of `phases`. `timeout` by default: one attempt of its
    pods and workers on the loaded machine (pace), and the examples' training."""
    if timeout is None:
        timeout = pace.job(get_job(api, namespace, name)["spec"]) + EXAMPLE_WORK_S

    def done() -> dict[str, Any] | None:
        job = get_job(api, namespace, name)
        return job if (job.get("status") or {}).get("phase") in phases else None

    try:
        result: dict[str, Any] = wait_for(f"{name} in {phases}", done, timeout, interval=0.5)
    except TimeoutError:
        job = get_job(api, namespace, name)
        raise AssertionError(f"{name} never reached {phases}: status={job.get('status')}") from None
    return result


def job_pods(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    items: list[Any] = (
        client.CoreV1Api(api)
        .list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={name}")
        .items
    )
    return items


def pod_log(api: client.ApiClient, namespace: str, pod: str, container: str = "trainer") -> str:
    """The container's log, as `kubectl logs` reads it on any cluster (through the API server,
    from the pod's node); "" while the pod or its container's log is not there."""
    try:
        text: str = client.CoreV1Api(api).read_namespaced_pod_log(
            pod, namespace, container=container
        )
    except ApiException as e:
        if e.status in (400, 404):
            return ""
        raise
    return text


def _schedulable(node: Any) -> bool:
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    blocked = any(t.effect in ("NoSchedule", "NoExecute") for t in node.spec.taints or [])
    return ready and not blocked and not node.spec.unschedulable


def schedulable_nodes(api: client.ApiClient) -> list[Any]:
    """The Ready nodes a pod without tolerations can land on (not kind's control plane)."""
    return [n for n in client.CoreV1Api(api).list_node().items if _schedulable(n)]


def one_per_node(api: client.ApiClient, timeout: float = 60.0) -> tuple[int, str]:
    """(N, cpu): N schedulable nodes, and a CPU request of which each of them holds exactly one.

    The request is more than half of the largest node's allocatable CPU, so no node takes two,
    and no more than the smallest node has free, so each takes one: N pods run and pod N+1
    stays Pending, on localkube's 8-CPU process nodes as on kind's 2-CPU ones. Waits for pods
    of earlier tests that still hold CPU to go.
    """
    core = client.CoreV1Api(api)

    def sized() -> tuple[int, str] | None:
        nodes = schedulable_nodes(api)
        if not nodes:
            return None
        held: dict[str, float] = {}
        pods: list[Any] = core.list_pod_for_all_namespaces().items
        for pod in pods:
            if pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed"):
                for c in pod.spec.containers:
                    cpu = ((c.resources and c.resources.requests) or {}).get("cpu", "0")
                    held[pod.spec.node_name] = held.get(pod.spec.node_name, 0.0) + float(
                        parse_quantity(cpu)
                    )
        alloc = {n.metadata.name: float(parse_quantity(n.status.allocatable["cpu"])) for n in nodes}
        millis = int(max(alloc.values()) * 550)  # 55%: over half, with room for rounding
        free = min(alloc[name] - held.get(name, 0.0) for name in alloc)
        return (len(nodes), f"{millis}m") if millis <= free * 1000 else None

    result: tuple[int, str] = wait_for("a CPU request each node fits once", sized, timeout)
    return result


class OperatorProcess:
    """The operator as users run it (`torchrun-operator`), as a subprocess we can kill."""

    def __init__(
        self,
        kubeconfig: Path,
        log_dir: Path,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        tag: str = "",
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.extra = extra or []
        self.env = env or {}
        self.tag = tag
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0
        self.runs = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.tag or self.runs}.log"

    def start(self) -> None:
        self.runs += 1
        self.metrics_port = free_port()
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), **self.env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), env.get("PYTHONPATH", "")])
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torchrun_operator.main",
                "--all-namespaces",
                "--liveness-port",
                "0",
                "--metrics-port",
                str(self.metrics_port),
                *self.extra,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def dtj_status(cluster: Any, ns: str, name: str) -> str:
    """`kubectl dtj status` as a user runs it, against `cluster` (its kubeconfig)."""
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "torchrun_operator.cli.main", "status", name, "-n", ns],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
