"""The campaign's hold on a TTL's job (campaign_scenarios.HOLD) on a real apiserver: deleted,
the job stays readable with the status it was deleted in until the harness lets it go
(campaign_run.release), so a run whose job finished and was deleted while the harness waited
out an apiserver restart is still judged; and a run cut short leaves no namespace stuck on it
(campaign_run.release_held)."""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from campaign_run import deleted_unfinished, release, release_held
from campaign_scenarios import HOLD
from dtj import GROUP, PLURAL, VERSION, create_job, job_gone
from kubernetes import client
from localkube.testing import wait_for

pytestmark = pytest.mark.usefixtures("crd")


def held_job(kube: client.ApiClient, namespace: str, name: str, phase: str) -> None:
    custom = client.CustomObjectsApi(kube)
    create_job(kube, namespace, jobs.job(name, metadata={"finalizers": [HOLD]}))
    patch = {"status": {"phase": phase}}
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, patch)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def test_a_deleted_job_is_read_as_it_was_deleted_until_the_harness_lets_it_go(
    kube: client.ApiClient, namespace: str
) -> None:
    custom = client.CustomObjectsApi(kube)
    held_job(kube, namespace, "finished", "Succeeded")
    held_job(kube, namespace, "cut-short", "Running")

    job: Any = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "finished")
    assert job["metadata"]["deletionTimestamp"] and job["status"]["phase"] == "Succeeded"
    assert deleted_unfinished(job) == []
    release(custom, namespace, job)
    wait_for("the finished job gone", lambda: job_gone(kube, namespace, "finished"), 30)

    early: Any = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "cut-short")
    assert deleted_unfinished(early) == ["deleted while 'Running', unfinished"]
    assert not job_gone(kube, namespace, "cut-short")  # still held
    release_held(kube, namespace)
    wait_for("the held job gone", lambda: job_gone(kube, namespace, "cut-short"), 30)
