"""Bad jobs are refused by the real apiserver, with a message a person understands."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from dtj import create_job
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.usefixtures("crd")

GOOD: dict[str, Any] = {
    "apiVersion": "torchrun.dev/v1alpha1",
    "kind": "DistributedTrainingJob",
    "metadata": {"name": "ok"},
    "spec": {
        "nodes": 2,
        "nprocPerNode": 2,
        "template": {
            "spec": {
                "containers": [
                    {"name": "trainer", "image": "pytorch/pytorch", "command": ["python", "t.py"]}
                ]
            }
        },
    },
}


def _job(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = doc
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is _DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return doc


_DELETE = object()


def _rejection(kube: client.ApiClient, namespace: str, doc: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as info:
        create_job(kube, namespace, doc)
    # Schema and CEL failures are 422 Invalid; strict decoding of unknown fields is 400.
    assert info.value.status in (400, 422), info.value.body
    message: str = json.loads(info.value.body)["message"]
    return message


def test_a_good_job_is_accepted_with_defaults(kube: client.ApiClient, namespace: str) -> None:
    created = create_job(kube, namespace, GOOD)
    spec = created["spec"]
    assert spec["rendezvous"]["port"] == 29400
    assert spec["failurePolicy"]["maxRestarts"] >= 0


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"spec__template__spec__containers__0__image": _DELETE}, "image"),
        ({"spec__template__spec__containers__0__image": ""}, "image"),
        ({"spec__template__spec__containers__0__command": _DELETE}, "command"),
        ({"spec__template__spec__containers__0__command": []}, "command"),
        ({"spec__nodes": 0}, "nodes"),
        ({"spec__elastic": {"minNodes": 3, "maxNodes": 2}}, "minNodes"),
        ({"spec__nprocPerNode": "gpu"}, "nvidia.com/gpu"),
        ({"spec__nprocPerNode": 0}, "nprocPerNode"),
        ({"metadata__name": "a" * 62}, "too long"),
        ({"metadata__name": "9lives"}, "DNS-1035"),
        ({"spec__nodez": 3}, "nodez"),
        ({"spec__rendezvous": {"port": 29400, "bogus": 1}}, "bogus"),
    ],
    ids=[
        "no-image",
        "empty-image",
        "no-command",
        "empty-command",
        "zero-nodes",
        "min-over-max",
        "gpu-without-limit",
        "zero-procs",
        "name-too-long",
        "name-not-dns",
        "unknown-field",
        "unknown-nested-field",
    ],
)
def test_bad_jobs_are_rejected_at_admission(
    kube: client.ApiClient, namespace: str, changes: dict[str, Any], expected: str
) -> None:
    message = _rejection(kube, namespace, _job(**changes))
    assert expected in message, message
