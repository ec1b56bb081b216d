"""Training pods get no API token unless the template asks for one."""

from __future__ import annotations

import copy
from typing import Any

import jobs
import pytest
from torchrun_operator.render import render_pod


def make_job(**pod_spec: Any) -> dict[str, Any]:
    return jobs.job(
        "j",
        image="i",
        command=["python", "x"],
        trainer={"name": "t"},
        pod=pod_spec,
        metadata={"namespace": "ns", "uid": "u"},
    )


def test_no_service_account_token_by_default() -> None:
    for node in (0, 1):
        assert render_pod(make_job(), node, 0)["spec"]["automountServiceAccountToken"] is False


def test_no_token_even_with_a_named_service_account() -> None:
    # A ServiceAccount's own automount setting is overridden by the pod's: the template must
    # say true to get a token (docs/security.md).
    pod = render_pod(make_job(serviceAccountName="trainer"), 0, 0)
    assert pod["spec"]["serviceAccountName"] == "trainer"
    assert pod["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("explicit", [True, False])
def test_the_template_decides_when_it_sets_the_field(explicit: bool) -> None:
    job = make_job(automountServiceAccountToken=explicit)
    before = copy.deepcopy(job)
    assert render_pod(job, 0, 0)["spec"]["automountServiceAccountToken"] is explicit
    assert job == before
