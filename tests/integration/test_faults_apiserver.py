"""Faults where they really happen: the apiserver itself refuses chosen status writes.

A ValidatingAdmissionPolicy refuses, for one job only, the status write that records
`phase: Succeeded`. The operator must not act on a decision it could not record: the finished
pods stay (cleanPodPolicy would delete them only after the write), the job is never
restarted, and once the policy goes the job ends Succeeded with every counter at zero.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from dtj import GROUP, create_job, get_job, job_pods, quick_job, wait_for, wait_phase
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.usefixtures("operator")


def refuse_status(name: str, namespace: str, phase: str) -> list[dict[str, Any]]:
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": ["distributedtrainingjobs/status"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": (
                        "!has(object.status) || !has(object.status.phase) || "
                        f"object.status.phase != '{phase}'"
                    ),
                    "message": f"injected fault: status.phase {phase} refused",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    return [policy, binding]


@pytest.fixture
def admission(kube: client.ApiClient) -> Iterator[client.AdmissionregistrationV1Api]:
    api = client.AdmissionregistrationV1Api(kube)
    made: list[str] = []
    api.made = made  # type: ignore[attr-defined]
    yield api
    for name in made:
        for delete in (
            api.delete_validating_admission_policy_binding,
            api.delete_validating_admission_policy,
        ):
            try:
                delete(name)
            except ApiException as e:
                if e.status != 404:
                    raise


def test_refused_succeeded_write_never_restarts_a_finished_job(
    kube: client.ApiClient, namespace: str, admission: Any
) -> None:
    name = "refused"
    policy, binding = refuse_status(f"{namespace}-refuse", namespace, "Succeeded")
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    admission.made.append(policy["metadata"]["name"])
    # The policy takes effect once the apiserver has loaded it: wait until it refuses.
    time.sleep(2)

    create_job(kube, namespace, quick_job(name))  # default cleanPodPolicy: KeepFailed

    def all_pods_succeeded() -> bool:
        pods = job_pods(kube, namespace, name)
        return len(pods) == 2 and all(p.status.phase == "Succeeded" for p in pods)

    wait_for("both pods Succeeded", all_pods_succeeded, 180)
    time.sleep(8)  # several reconciles, each refused
    job = get_job(kube, namespace, name)
    st = job["status"]
    assert st["phase"] != "Succeeded"
    assert st["attempt"] == 0 and st["counters"]["restarts"] == 0, st
    assert not st.get("restarts"), st
    pods = job_pods(kube, namespace, name)
    assert sorted(p.metadata.name for p in pods) == [f"{name}-0", f"{name}-1"]
    assert all(p.metadata.deletion_timestamp is None for p in pods), "deleted before recorded"

    admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
    st = done["status"]
    assert st["phase"] == "Succeeded", st
    assert st["counters"] == {"userFailures": 0, "infrastructureFailures": 0, "restarts": 0}
    assert st["attempt"] == 0 and not st.get("restarts")
    wait_for("Succeeded pods cleaned", lambda: not job_pods(kube, namespace, name), 60)
