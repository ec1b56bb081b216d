"""The campaign's job watch (campaign_monitor.JobWatch) on a real apiserver: a job that
finished and was deleted before the harness read it again is judged by the state it was
deleted in, which is how the campaign judges a TTL's job it did not see finish (what stands
for it when the watch missed the deletion: tests/unit/test_faultrun_schedule.py)."""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from campaign_monitor import JobWatch
from campaign_run import deleted_job
from dtj import GROUP, PLURAL, VERSION, create_job
from kubernetes import client
from localkube.testing import wait_for

pytestmark = pytest.mark.usefixtures("crd")


def test_a_job_deleted_between_two_reads_is_judged_by_its_last_state(
    kube: client.ApiClient, namespace: str
) -> None:
    custom = client.CustomObjectsApi(kube)
    name = "gone-soon"
    with JobWatch(kube, namespace, name) as watch:
        create_job(kube, namespace, jobs.job(name))
        patch = {"status": {"phase": "Succeeded"}}
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, patch)
        wait_for(
            "the finish seen", lambda: ((watch.last or {}).get("status") or {}).get("phase"), 30
        )
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        last: Any = deleted_job(watch, None, name)
    assert watch.deleted
    assert last["metadata"]["name"] == name and last["status"]["phase"] == "Succeeded"
