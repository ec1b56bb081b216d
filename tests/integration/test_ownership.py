"""Other people's objects, on the real cluster: ownership is by controller uid alone.

A ConfigMap pre-created under the launcher's name never runs; a re-created job does not take
its orphaned namesake's pods for its own; a hand-made pod with the job's labels is neither
adopted nor deleted; a job re-created at once waits for its predecessor's children.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest
from dtj import (
    GROUP,
    IMAGE,
    JOB_LABEL,
    PLURAL,
    VERSION,
    create_job,
    get_job,
    job_pods,
    quick_job,
    wait_for,
)
from dtj import wait_phase as _wait_phase
from jobs import condition
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from torchrun_operator.api import names
from torchrun_operator.render.configmap import launcher_digest, packaged_launcher

pytestmark = pytest.mark.usefixtures("operator")


def wait_phase(kube: client.ApiClient, ns: str, name: str, phases: set[str]) -> dict[str, Any]:
    return _wait_phase(kube, ns, name, phases, timeout=180)


def wait_blocked(kube: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    def blocked() -> dict[str, Any] | None:
        c = condition(get_job(kube, ns, name), "Blocked")
        return c if c and c["status"] == "True" else None

    found: dict[str, Any] = wait_for(f"{name} Blocked", blocked, timeout=60)
    return found


def warning_reasons(kube: client.ApiClient, ns: str, name: str) -> set[str]:
    evs: Any = client.CoreV1Api(kube).list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name}"
    )
    return {e.reason for e in evs.items if e.type == "Warning"}


def delete_job(kube: client.ApiClient, ns: str, name: str, policy: str = "Background") -> None:
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name, propagation_policy=policy
    )


def test_precreated_launcher_configmap_never_runs(kube: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    name = "cm-squat"
    cm_name = names.launcher_configmap_name(name, launcher_digest(packaged_launcher()))
    evil: dict[str, bytes | str] = {
        "launcher.pyz": base64.b64encode(b"import sys; sys.exit(0)\n").decode()
    }
    for cm in (cm_name, f"{name}-launcher"):  # the hashed name, and the name of old
        core.create_namespaced_config_map(
            namespace,
            client.V1ConfigMap(metadata=client.V1ObjectMeta(name=cm), binary_data=evil),
        )
    create_job(kube, namespace, quick_job(name))
    blocked = wait_blocked(kube, namespace, name)
    assert cm_name in blocked["message"], blocked
    time.sleep(3)
    assert job_pods(kube, namespace, name) == [], "no pod may start while the name is taken"
    assert get_job(kube, namespace, name)["status"]["phase"] == "Pending"
    wait_for(
        "ObjectInTheWay event",
        lambda: "ObjectInTheWay" in warning_reasons(kube, namespace, name),
        30,
    )
    # The foreign ConfigMaps are not ours: never deleted, never changed.
    assert core.read_namespaced_config_map(cm_name, namespace).binary_data == evil

    core.delete_namespaced_config_map(cm_name, namespace)
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert condition(done, "Blocked")["status"] == "False"
    ours: Any = core.read_namespaced_config_map(cm_name, namespace)
    assert [o.uid for o in ours.metadata.owner_references] == [done["metadata"]["uid"]]
    assert base64.b64decode(ours.binary_data["launcher.pyz"]) == packaged_launcher()
    assert core.read_namespaced_config_map(f"{name}-launcher", namespace).binary_data == evil


def test_recreated_job_does_not_adopt_orphaned_pods(kube: client.ApiClient, namespace: str) -> None:
    """`kubectl delete --cascade=orphan`, then the same job again: the orphans carry the
    job's labels and names but not its uid. The new job must not report Succeeded from
    them; it waits, blocked, until they are gone, then runs its own pods."""
    core = client.CoreV1Api(kube)
    name = "orphans"
    create_job(kube, namespace, quick_job(name, runPolicy={"cleanPodPolicy": "KeepAll"}))
    first = wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
    assert first["status"]["phase"] == "Succeeded"
    delete_job(kube, namespace, name, policy="Orphan")
    wait_for("job gone", lambda: not _exists(kube, namespace, name), 60)

    def orphaned() -> bool:
        pods = job_pods(kube, namespace, name)
        return bool(pods) and all(not p.metadata.owner_references for p in pods)

    wait_for("pods orphaned", orphaned, 60)
    second = create_job(kube, namespace, quick_job(name))
    blocked = wait_blocked(kube, namespace, name)
    assert "not this job's" in blocked["message"] or "no controller" in blocked["message"]
    time.sleep(3)
    job = get_job(kube, namespace, name)
    assert job["status"]["phase"] not in ("Succeeded", "Failed"), job["status"]
    for p in job_pods(kube, namespace, name):
        assert not p.metadata.owner_references, "nothing that is not ours is ever adopted"

    for p in job_pods(kube, namespace, name):
        core.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=0)
    core.delete_namespaced_service(name, namespace)
    # Every orphan is in the way until it goes: the launcher ConfigMap and the policy too.
    labels = f"{JOB_LABEL}={name}"
    core.delete_collection_namespaced_config_map(namespace, label_selector=labels)
    client.NetworkingV1Api(kube).delete_collection_namespaced_network_policy(
        namespace, label_selector=labels
    )
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
    uid = second["metadata"]["uid"]
    for p in job_pods(kube, namespace, name):
        assert [o.uid for o in p.metadata.owner_references] == [uid]


def test_handmade_pod_with_the_jobs_labels_is_left_alone(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    name = "handmade"
    labels = {JOB_LABEL: name, names.LABEL_NODE_RANK: "5", names.LABEL_ATTEMPT: "0"}
    core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="not-the-operators", labels=labels),
            spec=client.V1PodSpec(
                restart_policy="Never",
                containers=[client.V1Container(name="c", image=IMAGE, command=["sleep", "600"])],
            ),
        ),
    )
    create_job(kube, namespace, quick_job(name, runPolicy={"cleanPodPolicy": "Delete"}))
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
    wait_for("own pods deleted", lambda: len(job_pods(kube, namespace, name)) == 1, 60)
    pod: Any = core.read_namespaced_pod("not-the-operators", namespace)
    assert pod.metadata.deletion_timestamp is None, "a pod that is not ours is never deleted"


def test_job_recreated_at_once_waits_for_its_predecessors_children(
    kube: client.ApiClient, namespace: str
) -> None:
    name = "again"
    create_job(kube, namespace, quick_job(name, runPolicy={"cleanPodPolicy": "KeepAll"}))
    wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
    # Foreground: the job lingers until the garbage collector has deleted its children,
    # so the next create must wait for the name; background deletion leaves children behind
    # for a moment, which is the race under test.
    delete_job(kube, namespace, name, policy="Background")
    wait_for("job gone", lambda: not _exists(kube, namespace, name), 60)
    second = create_job(kube, namespace, quick_job(name))
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
    svc: Any = client.CoreV1Api(kube).read_namespaced_service(name, namespace)
    assert [o.uid for o in svc.metadata.owner_references] == [second["metadata"]["uid"]]


def _exists(kube: client.ApiClient, ns: str, name: str) -> bool:
    try:
        get_job(kube, ns, name)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise
