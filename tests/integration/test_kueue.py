"""Kueue on any cluster (the local one, kind): jobs labelled kueue.x-k8s.io/queue-name are
admitted by a real Kueue (built by `cluster/build.sh kueue`, run on this host with its webhooks
by localkube.kueue) through the Workload the operator creates and follows (docs/scheduling.md).

While these tests run, the session's operator is replaced by one started with --kueue (both
would act on every job).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobs
import pace
import pytest
from dtj import (
    OperatorProcess,
    apply,
    dtj_status,
    get_job,
    job_pods,
    schedulable_nodes,
    wait_for,
    wait_phase,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube.kueue import Kueue

KUEUE = ("kueue.x-k8s.io", "v1beta2")
EXTERNAL_FRAMEWORK = "DistributedTrainingJob.v1alpha1.torchrun.dev"
# attempt 0 of the evicted job trains "forever"; any later attempt finishes at once. torchrun
# gives the workers the rendezvous id, `<job uid>-<attempt>`, as TORCHELASTIC_RUN_ID.
SCRIPT = """\
import os, sys, time
attempt = os.environ["TORCHELASTIC_RUN_ID"].rsplit("-", 1)[1]
print(f"attempt {attempt} rank {os.environ['RANK']}", flush=True)
time.sleep(float(sys.argv[1]) if attempt == "0" else 0)
"""


@pytest.fixture(scope="module")
def kueue(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    k = Kueue(cluster, tmp_path_factory.mktemp("kueue"), [EXTERNAL_FRAMEWORK]).start()
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture(scope="module")
def kueue_operator(
    operator: OperatorProcess, kueue: Kueue, cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    operator.kill()
    op = OperatorProcess(
        Path(cluster.kubeconfig), tmp_path_factory.mktemp("kueue-operator"), extra=["--kueue"]
    )
    op.start()
    try:
        yield op
    finally:
        op.kill()
        operator.start()
    assert "Traceback" not in op.log(), op.log()[-4000:]


def custom(kube: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube)


@pytest.fixture
def flavor_node(kube: client.ApiClient) -> str:
    """The node the ResourceFlavor names: the last schedulable one by name (node-1 of the
    local cluster, a worker of kind's)."""
    names = sorted(n.metadata.labels["kubernetes.io/hostname"] for n in schedulable_nodes(kube))
    assert names, "no schedulable node"
    return names[-1]


@pytest.fixture
def queue(kube: client.ApiClient, namespace: str, kueue: Kueue, flavor_node: str) -> Iterator[str]:
    """A ResourceFlavor that puts pods on `flavor_node`, a ClusterQueue with room for 1 CPU
    (one job of 2 pods x 500m: a kind worker of two cores has room for it beside its
    DaemonSets) that preempts lower priorities for higher ones, WorkloadPriorityClasses
    `<namespace>-low` and `-high`, and a LocalQueue `q` in the test's namespace."""
    api = custom(kube)
    flavor, cq = f"f-{namespace}", f"cq-{namespace}"
    for level, value in (("low", 10), ("high", 1000)):
        api.create_cluster_custom_object(
            *KUEUE,
            "workloadpriorityclasses",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": f"{namespace}-{level}"},
                "value": value,
            },
        )
    api.create_cluster_custom_object(
        *KUEUE,
        "resourceflavors",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": {"kubernetes.io/hostname": flavor_node}},
        },
    )
    api.create_cluster_custom_object(
        *KUEUE,
        "clusterqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "1"},
                                    {"name": "memory", "nominalQuota": "4Gi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    api.create_namespaced_custom_object(
        *KUEUE,
        namespace,
        "localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "q"},
            "spec": {"clusterQueue": cq},
        },
    )
    yield "q"
    for plural, name in (
        ("clusterqueues", cq),
        ("resourceflavors", flavor),
        ("workloadpriorityclasses", f"{namespace}-low"),
        ("workloadpriorityclasses", f"{namespace}-high"),
    ):
        try:
            api.delete_cluster_custom_object(*KUEUE, plural, name)
        except ApiException as e:
            if e.status != 404:
                raise


def queued_job(
    kube: client.ApiClient,
    ns: str,
    name: str,
    seconds: float,
    priority: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """2 pods x 1 process, 500m CPU each, in queue `q`; attempt 0 sleeps `seconds`. `priority`:
    low or high; `spec`: more fields of the spec."""
    labels = {"kueue.x-k8s.io/queue-name": "q"}
    if priority is not None:
        labels["kueue.x-k8s.io/priority-class"] = f"{ns}-{priority}"
    cpu = {"cpu": "500m", "memory": "1Gi"}
    docs = jobs.scripted(
        name,
        {"job.py": SCRIPT},
        ["python", f"{jobs.WORKSPACE}/job.py", str(seconds)],
        nproc=1,
        image="python:3.11",
        metadata={"labels": labels},
        trainer={"resources": {"requests": cpu, "limits": cpu}},
        pod={"terminationGracePeriodSeconds": 2},
        rendezvous={"joinTimeoutSeconds": 90},
        # No restart allowed: an eviction that spent the budget would fail the job.
        failurePolicy={"maxRestarts": 0},
        **spec,
    )
    return apply(kube, ns, docs)


def workload(kube: client.ApiClient, ns: str, job: str) -> dict[str, Any] | None:
    listed: Any = custom(kube).list_namespaced_custom_object(
        *KUEUE, ns, "workloads", label_selector=f"torchrun.dev/job-name={job}"
    )
    items = listed["items"]
    return items[0] if items else None


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = jobs.condition(obj, type_) or {}
    return found


def phase(kube: client.ApiClient, ns: str, name: str) -> str | None:
    return (get_job(kube, ns, name).get("status") or {}).get("phase")


def wait_workload(
    kube: client.ApiClient, ns: str, job: str, type_: str, status: str, timeout: float = 30.0
) -> dict[str, Any]:
    """The job's Workload once its condition `type_` has this status."""
    found: dict[str, Any] = wait_for(
        f"the {job} Workload's {type_} {status}",
        lambda: (
            (w := workload(kube, ns, job)) and condition(w, type_).get("status") == status and w
        ),
        timeout,
    )
    return found


def start_queued(
    kube: client.ApiClient,
    ns: str,
    name: str,
    seconds: float,
    phases: set[str],
    timeout: float,
    priority: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """queued_job, then the job once it reached one of `phases` (admitted, its pods made)."""
    queued_job(kube, ns, name, seconds, priority, **spec)
    return wait_phase(kube, ns, name, phases, timeout)


# The operator's own reasons while Kueue has not yet said anything about the job's Workload
# (reconcile/admission.py): the Workload is being created, or waits for Kueue's first look.
NOT_YET_SEEN_BY_KUEUE = ("WorkloadCreating", "Queued")


def wait_not_admitted(kube: client.ApiClient, ns: str, name: str, timeout: float) -> dict[str, Any]:
    """The job's Admitted condition once the job is Queued and Kueue has said why it is not
    admitted (its reason): a busy machine can show the operator's interim reasons first."""

    def said() -> dict[str, Any] | None:
        job = get_job(kube, ns, name)
        if (job.get("status") or {}).get("phase") != "Queued":
            return None
        admitted = condition(job, "Admitted")
        return None if admitted.get("reason") in NOT_YET_SEEN_BY_KUEUE else admitted

    try:
        admitted: dict[str, Any] = wait_for(f"{name} Queued, with Kueue's reason", said, timeout)
    except TimeoutError:
        raise AssertionError(
            f"{name} never Queued with Kueue's reason: {get_job(kube, ns, name).get('status')}"
        ) from None
    assert admitted["status"] == "False", admitted
    return admitted


def wait_succeeded(kube: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """The job once it ended, within two attempts' start (a resumed job's: pace; the jobs
    here sleep seconds at most when they are to end); it must have succeeded."""
    done = wait_phase(kube, ns, name, {"Succeeded", "Failed"}, pace.attempts(2))
    assert done["status"]["phase"] == "Succeeded", done["status"]
    return done


def wait_resumed(kube: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """Waits for the job to end: it succeeded on its second attempt with no restart counted,
    the first suspended once. Returns the record of that suspension."""
    st = wait_succeeded(kube, ns, name)["status"]
    assert st["attempt"] == 1
    assert st["counters"] == {"userFailures": 0, "infrastructureFailures": 0, "restarts": 0}
    record: dict[str, Any]
    [record] = st["restarts"]
    assert record["kind"] == "suspend", record
    return record


@pytest.mark.usefixtures("kueue_operator")
def test_quota_for_one_job_runs_the_second_only_after_the_first(
    kube: client.ApiClient, namespace: str, queue: str, cluster: Any, flavor_node: str
) -> None:
    ns = namespace
    start_queued(kube, ns, "first", 15, {"Starting", "Running"}, 120)
    # Kueue admits Workloads in the order they were created, to the second, and the operator
    # creates them when it sees each job: the second job is applied only once the first holds
    # the quota (two Workloads made in the same second were seen admitted the other way).
    queued_job(kube, ns, "second", 1)

    admitted = wait_not_admitted(kube, ns, "second", 60)
    assert admitted["reason"] == "Pending", admitted
    # Kueue's own words, from the Workload.
    assert "insufficient unused quota" in admitted["message"], admitted
    wl = workload(kube, ns, "second")
    assert wl is not None and condition(wl, "QuotaReserved")["message"] == admitted["message"]
    out = dtj_status(cluster, ns, "second")
    assert "Queued" in out and "insufficient unused quota" in out, out

    # While the first runs, the second has no pod at all.
    deadline = time.monotonic() + 300
    while phase(kube, ns, "first") not in ("Succeeded", "Failed"):
        assert job_pods(kube, ns, "second") == [], "the second job started before admission"
        assert time.monotonic() < deadline, "the first job never finished"
        time.sleep(0.5)
    first = get_job(kube, ns, "first")
    assert first["status"]["phase"] == "Succeeded", first["status"]
    first_wl = wait_workload(kube, ns, "first", "Finished", "True")
    assert condition(first_wl, "Finished")["reason"] == "Succeeded"

    # Admission put the flavor's node labels into the pods, as Kueue's integrations do.
    wait_for("the second job's pods", lambda: job_pods(kube, ns, "second"), 120)
    for pod in job_pods(kube, ns, "second"):
        assert pod.spec.node_selector == {"kubernetes.io/hostname": flavor_node}
        assert pod.metadata.labels["kueue.x-k8s.io/podset"] == "workers"
    second = wait_succeeded(kube, ns, "second")
    assert condition(second, "Admitted")["status"] == "True"
    assert all(p.spec.node_name == flavor_node for p in job_pods(kube, ns, "second"))


@pytest.mark.usefixtures("kueue_operator")
def test_a_workload_kueue_could_not_read_the_namespace_of_is_queued_afresh(
    kube: client.ApiClient, namespace: str, queue: str
) -> None:
    """Campaign runs kueue-evict-39, -45 and -47: after an apiserver restart, Kueue's cache
    missed the namespace once, its scheduler wrote "Could not obtain workload namespace" on
    the Workload and never tried it again. Kueue's words are written here by hand on a
    Workload that waits for quota (the cache miss cannot be caused at will); the operator
    replaces the Workload, the real Kueue evaluates the new one, and the job then runs."""
    ns = namespace
    start_queued(kube, ns, "first", 3600, {"Starting", "Running"}, 120)
    queued_job(kube, ns, "second", 1)
    assert wait_not_admitted(kube, ns, "second", 60)["reason"] == "Pending"
    stuck = workload(kube, ns, "second")
    assert stuck is not None
    unread = f'Could not obtain workload namespace: Namespace "{ns}" not found'
    cond = {
        "type": "QuotaReserved",
        "status": "False",
        "reason": "Pending",
        "message": unread,
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    def unread_held() -> bool:
        """Writes Kueue's words again whenever Kueue's scheduler, evaluating the Workload
        anew (any event of its ClusterQueue wakes it, e.g. the first job's pods becoming
        ready), wrote its own verdict over them; true while the Workload says them."""
        w = workload(kube, ns, "second")
        if w is None or w["metadata"]["uid"] != stuck["metadata"]["uid"]:
            return False
        if condition(w, "QuotaReserved").get("message") == unread:
            return True
        custom(kube).patch_namespaced_custom_object_status(
            *KUEUE, ns, "workloads", w["metadata"]["name"], {"status": {"conditions": [cond]}}
        )
        return False

    def says_unread() -> bool:
        unread_held()
        return condition(get_job(kube, ns, "second"), "Admitted").get("message") == unread

    wait_for("the job to say what Kueue said", says_unread, 30)

    def replaced() -> dict[str, Any] | None:
        w = workload(kube, ns, "second")
        if w is not None and w["metadata"]["uid"] != stuck["metadata"]["uid"]:
            return w
        unread_held()
        return None

    fresh = wait_for("a new Workload", replaced, 60)
    # Kueue evaluated the new one: it says again what really holds it back.
    again = wait_for(
        "Kueue's verdict on the new Workload",
        lambda: (
            "insufficient unused quota"
            in condition(replaced() or {}, "QuotaReserved").get("message", "")
        ),
        30,
    )
    assert again and fresh["spec"]["queueName"] == "q"
    custom(kube).delete_namespaced_custom_object(
        "torchrun.dev", "v1alpha1", ns, "distributedtrainingjobs", "first"
    )
    done = wait_succeeded(kube, ns, "second")
    assert done["status"]["attempt"] == 0


@pytest.mark.usefixtures("kueue_operator")
def test_a_finished_job_frees_its_quota_only_once_its_pods_stopped(
    kube: client.ApiClient, namespace: str, queue: str
) -> None:
    """Issue 25, item 7: the Workload was marked Finished (Kueue frees the quota) as soon as
    the job ended, with its pods still running, and Kueue admitted the next job onto the
    resources they held. Here the first job fails by its deadline and cleanPodPolicy KeepAll
    keeps its pods running until their script ends; the second gets pods only after that."""
    ns = namespace
    policy = {"activeDeadlineSeconds": 8, "cleanPodPolicy": "KeepAll"}
    start_queued(kube, ns, "first", 45, {"Starting", "Running"}, 120, runPolicy=policy)
    queued_job(kube, ns, "second", 1)
    wait_phase(kube, ns, "second", {"Queued"}, 60)

    failed = wait_phase(kube, ns, "first", {"Succeeded", "Failed"}, 120)
    assert failed["status"]["phase"] == "Failed", failed["status"]
    assert condition(failed, "Failed")["reason"] == "DeadlineExceeded"
    # The premise: the job has failed and its pods still run (they sleep 45 s, the deadline
    # fired at 8 s), so they still use the quota.
    still = [p.status.phase for p in job_pods(kube, ns, "first")]
    assert "Running" in still, still

    wait_for("the second job's pods", lambda: job_pods(kube, ns, "second"), 240)
    # Once the second job was admitted, not one pod of the first runs any more.
    phases = {p.metadata.name: p.status.phase for p in job_pods(kube, ns, "first")}
    assert sorted(phases) == ["first-0", "first-1"], phases  # KeepAll
    assert set(phases.values()) <= {"Succeeded", "Failed"}, phases
    finished = wait_workload(kube, ns, "first", "Finished", "True")
    assert condition(finished, "Finished")["reason"] == "Failed"
    wait_succeeded(kube, ns, "second")


@pytest.mark.usefixtures("kueue_operator")
def test_eviction_suspends_without_a_restart_and_readmission_resumes_to_success(
    kube: client.ApiClient, namespace: str, queue: str, cluster: Any
) -> None:
    ns = namespace
    running = start_queued(kube, ns, "evicted", 3600, {"Running"}, 180)
    assert running["status"]["attempt"] == 0
    wl = workload(kube, ns, "evicted")
    assert wl is not None
    name = wl["metadata"]["name"]
    api = custom(kube)
    api.patch_namespaced_custom_object(*KUEUE, ns, "workloads", name, {"spec": {"active": False}})

    admitted = wait_not_admitted(kube, ns, "evicted", 60)
    assert admitted["reason"].startswith("Deactivated"), admitted
    wait_for("the evicted job's pods gone", lambda: job_pods(kube, ns, "evicted") == [], 120)
    # Once the pods are gone the operator releases the quota, as Kueue's integrations do.
    released = wait_workload(kube, ns, "evicted", "QuotaReserved", "False", 60)
    assert "admission" not in released["status"]
    status = get_job(kube, ns, "evicted")["status"]
    assert status["phase"] == "Queued"
    assert status["counters"]["restarts"] == 0 and status["counters"]["infrastructureFailures"] == 0
    assert "Deactivated" in dtj_status(cluster, ns, "evicted")

    api.patch_namespaced_custom_object(*KUEUE, ns, "workloads", name, {"spec": {"active": True}})
    record = wait_resumed(kube, ns, "evicted")
    assert record["reason"].startswith("Deactivated"), record
    wait_workload(kube, ns, "evicted", "Finished", "True")


@pytest.mark.usefixtures("kueue_operator")
def test_a_higher_priority_job_preempts_without_a_restart_and_the_preempted_one_resumes(
    kube: client.ApiClient, namespace: str, queue: str
) -> None:
    ns = namespace
    start_queued(kube, ns, "low", 3600, {"Running"}, 180, priority="low")
    wl = workload(kube, ns, "low")
    assert wl is not None and wl["spec"]["priority"] == 10
    queued_job(kube, ns, "high", 5, priority="high")

    admitted = wait_not_admitted(kube, ns, "low", 120)
    assert admitted["reason"] == "Preempted", admitted
    done = wait_succeeded(kube, ns, "high")
    assert done["status"]["attempt"] == 0

    record = wait_resumed(kube, ns, "low")
    assert record["reason"] == "Preempted", record
