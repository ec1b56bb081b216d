"""Jobs on training runtimes (docs/runtimes.md), end to end: real apiserver, operator, process
nodes and torchrun. A job gives its command and what differs; the runtime the rest."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jobs
import pace
import pytest
from dtj import (
    IMAGE,
    SMALL,
    create_job,
    get_job,
    job_pods,
    schedulable_nodes,
    wait_for,
    wait_phase,
)
from kubernetes import client
from torchrun_operator.api import names

pytestmark = pytest.mark.usefixtures("operator")

# The trainer checks, in every worker, that it sees the runtime's setting and the job's own.
CHECK = (
    "import os, sys; "
    "ok = os.environ.get('RUNTIME_SETTING') == 'from-runtime' "
    "and os.environ.get('JOB_SETTING') == 'from-job'; "
    "print('settings', os.environ.get('RUNTIME_SETTING'), os.environ.get('JOB_SETTING')); "
    "sys.exit(0 if ok else 3)"
)
SLEEP = "import time; time.sleep(3600)"


def cpu_runtime(name: str, namespace: str | None = None, value: str = "from-runtime") -> Any:
    return jobs.runtime(
        name,
        namespace=namespace,
        trainer={
            "image": IMAGE,
            "resources": SMALL,
            "env": [{"name": "RUNTIME_SETTING", "value": value}],
        },
        pod={"terminationGracePeriodSeconds": 2},
        nprocPerNode=1,
        rendezvous={"joinTimeoutSeconds": 90},
        failurePolicy={"maxRestarts": 2, "backoffSeconds": 0},
    )


def job_on(name: str, runtime: str, kind: str, program: str) -> dict[str, Any]:
    return jobs.on_runtime(
        name,
        runtime,
        kind=kind,
        trainer={
            "command": ["python", "-c", program],
            "env": [{"name": "JOB_SETTING", "value": "from-job"}],
        },
        runPolicy={"cleanPodPolicy": "KeepAll"},
    )


@pytest.fixture
def custom(kube: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube)


@pytest.fixture
def cluster_runtime(custom: client.CustomObjectsApi, namespace: str) -> Iterator[str]:
    """A ClusterDistributedTrainingRuntime of this test's own (named after its namespace)."""
    name = f"{namespace}-cpu"
    custom.create_cluster_custom_object(
        names.GROUP, names.VERSION, names.CLUSTER_RUNTIME_PLURAL, cpu_runtime(name)
    )
    yield name
    custom.delete_cluster_custom_object(
        names.GROUP, names.VERSION, names.CLUSTER_RUNTIME_PLURAL, name
    )


def _env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}


def test_a_job_on_a_cluster_runtime_succeeds_with_the_merged_settings(
    kube: client.ApiClient, namespace: str, cluster_runtime: str, custom: Any
) -> None:
    create_job(kube, namespace, job_on("ten", cluster_runtime, names.CLUSTER_RUNTIME_KIND, CHECK))
    done = wait_phase(kube, namespace, "ten", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
    rt = custom.get_cluster_custom_object(
        names.GROUP, names.VERSION, names.CLUSTER_RUNTIME_PLURAL, cluster_runtime
    )
    record = done["status"]["runtime"]
    assert (record["kind"], record["name"], record["uid"]) == (
        names.CLUSTER_RUNTIME_KIND,
        cluster_runtime,
        rt["metadata"]["uid"],
    )
    assert record["resourceVersion"] == rt["metadata"]["resourceVersion"]
    pods = job_pods(kube, namespace, "ten")
    assert len(pods) == 2
    for pod in pods:
        assert pod.spec.containers[0].image == IMAGE  # the runtime's
        env = _env(pod)
        assert env["RUNTIME_SETTING"] == "from-runtime" and env["JOB_SETTING"] == "from-job"
        assert pod.spec.termination_grace_period_seconds == 2


def test_a_job_whose_namespaced_runtime_appears_later_starts_then(
    kube: client.ApiClient, namespace: str, custom: Any
) -> None:
    create_job(kube, namespace, job_on("later", "cpu", names.RUNTIME_KIND, CHECK))

    def waiting() -> dict[str, Any] | None:
        job = get_job(kube, namespace, "later")
        c = jobs.condition(job, "RuntimeResolved")
        return job if c and c["reason"] == "RuntimeNotFound" else None

    job = wait_for("the job to say its runtime is missing", waiting, timeout=60)
    assert job["status"]["phase"] == "Pending"
    assert "DistributedTrainingRuntime cpu" in jobs.condition(job, "RuntimeResolved")["message"]
    assert job_pods(kube, namespace, "later") == []
    custom.create_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, names.RUNTIME_PLURAL, cpu_runtime("cpu", namespace)
    )
    done = wait_phase(kube, namespace, "later", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert jobs.condition(done, "RuntimeResolved")["status"] == "True"
    assert done["status"]["runtime"]["kind"] == names.RUNTIME_KIND
    for pod in job_pods(kube, namespace, "later"):
        assert _env(pod)["RUNTIME_SETTING"] == "from-runtime"


def test_a_runtime_edited_while_the_job_runs_changes_nothing_in_it_nor_its_gang_restart(
    kube: client.ApiClient, namespace: str, cluster_runtime: str, custom: Any
) -> None:
    create_job(kube, namespace, job_on("edit", cluster_runtime, names.CLUSTER_RUNTIME_KIND, SLEEP))
    wait_phase(kube, namespace, "edit", {"Running"})
    before = {p.metadata.name: p for p in job_pods(kube, namespace, "edit")}
    # The edit: another setting, and no restarts at all. Were it applied, the pod deleted
    # below would fail the job instead of restarting it.
    rt = custom.get_cluster_custom_object(
        names.GROUP, names.VERSION, names.CLUSTER_RUNTIME_PLURAL, cluster_runtime
    )
    edited = cpu_runtime(cluster_runtime, value="edited")
    edited["spec"]["failurePolicy"] = {"maxRestarts": 0}
    edited["metadata"]["resourceVersion"] = rt["metadata"]["resourceVersion"]
    custom.replace_cluster_custom_object(
        names.GROUP, names.VERSION, names.CLUSTER_RUNTIME_PLURAL, cluster_runtime, edited
    )
    core = client.CoreV1Api(kube)
    core.delete_namespaced_pod("edit-0", namespace)

    def next_attempt() -> list[Any] | None:
        pods = [
            p
            for p in job_pods(kube, namespace, "edit")
            if p.metadata.labels.get(names.LABEL_ATTEMPT) == "1"
        ]
        return pods if len(pods) == 2 else None

    restarted = wait_for("attempt 1's pods", next_attempt, timeout=120)
    job = get_job(kube, namespace, "edit")
    assert job["status"]["attempt"] == 1 and job["status"]["phase"] != "Failed"
    assert job["status"]["runtime"]["resourceVersion"] == rt["metadata"]["resourceVersion"]
    # One restart, for the deleted pod: the edit itself restarted nothing (no SpecChanged).
    assert [r["reason"] for r in job["status"]["restarts"]] == ["PodDeleted"]
    old = before["edit-1"]
    for pod in restarted:
        assert _env(pod)["RUNTIME_SETTING"] == "from-runtime"
        assert pod.spec.containers[0].image == old.spec.containers[0].image
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        names.GROUP, names.VERSION, namespace, names.PLURAL, "edit"
    )


def test_two_host_network_jobs_on_the_same_nodes_both_rendezvous(
    kube: client.ApiClient, namespace: str, custom: Any
) -> None:
    """Two host-network jobs, each with a pod on every node, at once: the apiserver makes their
    container ports host ports, and the scheduler would keep pods with one host port apart,
    so both run together only because each job has ports of its own. (The process node gives
    every pod its own network namespace even with hostNetwork, docs/runtimes.md: the ports
    are judged by the apiserver and the scheduler, as on a real node.)"""
    # One pod per node a pod can land on (kind's control plane is tainted).
    nodes = len(schedulable_nodes(kube))
    name = f"{namespace}-hostnet"
    rt = cpu_runtime(name)
    rt["spec"]["template"]["spec"]["hostNetwork"] = True
    custom.create_cluster_custom_object(
        names.GROUP, names.VERSION, names.CLUSTER_RUNTIME_PLURAL, rt
    )
    try:
        for job in ("hn-a", "hn-b"):
            doc = job_on(job, name, names.CLUSTER_RUNTIME_KIND, SLEEP)
            doc["spec"]["nodes"] = nodes
            create_job(kube, namespace, doc)

        def both_rendezvoused() -> bool:
            return all(
                (jobs.condition(get_job(kube, namespace, j), "RendezvousDone") or {}).get("status")
                == "True"
                for j in ("hn-a", "hn-b")
            )

        try:
            # Both jobs' launchers start torch together (their workers only sleep).
            budget = pace.launchers(2 * nodes, 0)
            wait_for("both jobs to rendezvous", both_rendezvoused, timeout=budget)
        except TimeoutError:
            states = {
                j: (
                    get_job(kube, namespace, j).get("status"),
                    [
                        (
                            p.metadata.name,
                            p.spec.node_name,
                            p.status.phase,
                            p.status.pod_ip,
                            p.status.message,
                        )
                        for p in job_pods(kube, namespace, j)
                    ],
                )
                for j in ("hn-a", "hn-b")
            }
            raise AssertionError(f"not both rendezvoused: {states}") from None
        seen: dict[str, tuple[set[int], set[str]]] = {}
        for job in ("hn-a", "hn-b"):
            pods = job_pods(kube, namespace, job)
            assert len(pods) == nodes
            for pod in pods:
                assert pod.spec.host_network and pod.spec.dns_policy == "ClusterFirstWithHostNet"
                # The apiserver made every declared port a host port.
                assert all(p.host_port == p.container_port for p in pod.spec.containers[0].ports)
            node_names = {p.spec.node_name for p in pods}
            assert len(node_names) == nodes  # one pod per node: the host ports keep them apart
            ports = {p.container_port for pod in pods for p in pod.spec.containers[0].ports}
            seen[job] = (ports, node_names)
        assert seen["hn-a"][1] == seen["hn-b"][1]  # the same nodes
        assert not seen["hn-a"][0] & seen["hn-b"][0]  # and no port in common
    finally:
        for job in ("hn-a", "hn-b"):
            custom.delete_namespaced_custom_object(
                names.GROUP, names.VERSION, namespace, names.PLURAL, job
            )
        custom.delete_cluster_custom_object(
            names.GROUP, names.VERSION, names.CLUSTER_RUNTIME_PLURAL, name
        )
