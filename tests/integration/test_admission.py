"""Bad jobs are refused by the real apiserver, with a message a person understands.

Every case of tests/unit/api/bad_input.py is applied (a transition case: created, then
updated); the messages make the table in docs/bad-input.md, which must match the committed
file. After a deliberate change: UPDATE_BAD_INPUT_TABLE=1 rewrites it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dtj import GROUP, PLURAL, REPO, VERSION, create_job
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube.testing import namespace_name
from torchrun_operator.api import models

pytestmark = pytest.mark.usefixtures("crd")

TABLE = REPO / "docs" / "bad-input.md"
UPDATE_ENV = "UPDATE_BAD_INPUT_TABLE"


def _load_cases() -> Any:
    """tests/unit/api/bad_input.py: shared with the model's unit test, which is not a package."""
    path = Path(__file__).resolve().parents[1] / "unit" / "api" / "bad_input.py"
    spec = importlib.util.spec_from_file_location("bad_input", path)
    assert spec is not None and spec.loader is not None
    if spec.name in sys.modules:  # the unit test, in the same session, loaded it first
        return sys.modules[spec.name]
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


bad = _load_cases()
CASES = {c.id: c for c in bad.CASES}


def _custom(kube: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube)


def _update(kube: client.ApiClient, namespace: str, name: str, changes: dict[str, Any]) -> None:
    """A full update (PUT) of the live object, as `kubectl edit` does; list items included.
    A 409 means the status moved under us (an operator left running by an earlier test file
    reconciles the job): read again and retry, as `kubectl edit` asks its user to."""
    for _ in range(5):
        live = _custom(kube).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        try:
            _custom(kube).replace_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, bad.apply(live, changes)
            )
            return
        except ApiException as e:
            if e.status != 409:
                raise
    raise AssertionError(f"{name}: the update kept conflicting with other writers")


def _message(e: ApiException) -> str:
    return str(json.loads(str(e.body))["message"])


def _refusal(kube: client.ApiClient, namespace: str, case: Any) -> tuple[int, str]:
    """(HTTP status, message) of the refusal; status 0 when there was none."""
    doc = bad.job(case)
    if case.update is not None:
        doc["metadata"]["name"] = case.id
    try:
        created = create_job(kube, namespace, doc)
    except ApiException as e:
        if case.update is None:
            return e.status, _message(e)
        return 0, f"the create, not the update, was refused: {_message(e)}"
    if case.update is None:
        name = created["metadata"]["name"]
        _custom(kube).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return 0, "accepted"
    try:
        _update(kube, namespace, case.id, case.update)
    except ApiException as e:
        return e.status, _message(e)
    return 0, "the update was accepted"


@pytest.fixture(scope="module")
def refusals(kube: client.ApiClient) -> Iterator[dict[str, tuple[int, str]]]:
    """Every case, tried once in a namespace of its own: per-case tests and the table share it."""
    core = client.CoreV1Api(kube)
    ns = namespace_name("bad-input")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        yield {case.id: _refusal(kube, ns, case) for case in bad.CASES}
    finally:
        core.delete_namespace(ns)


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input_is_refused(refusals: dict[str, tuple[int, str]], case_id: str) -> None:
    status, message = refusals[case_id]
    # Schema and CEL failures are 422 Invalid; strict decoding of unknown fields is 400.
    assert status in (400, 422), f"{case_id}: {message}"
    assert CASES[case_id].expected in message, message


def _short(message: str, name: str) -> str:
    """The message without the prefix every refusal of a job has."""
    prefix = f'DistributedTrainingJob.{GROUP} "{name}" is invalid: '
    return message.removeprefix(prefix)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(refusals: dict[str, tuple[int, str]]) -> str:
    rows = [
        "| # | case | bad input | apiserver's message |",
        "| --- | --- | --- | --- |",
    ]
    for i, case in enumerate(bad.CASES, 1):
        status, message = refusals[case.id]
        name = case.id if case.update else bad.job(case)["metadata"]["name"]
        what = bad.describe(case.changes) or "a good job"
        if case.update:
            what = f"create with {what}, then update {bad.describe(case.update)}"
        if case.why:
            what += f" ({case.why})"
        said = f"{status}: {_short(message, name)}"
        rows.append(f"| {i} | {case.id} | {_cell(what)} | {_cell(said)} |")
    return HEADER + "\n".join(rows) + "\n"


def _days(seconds: int) -> str:
    days = seconds // (24 * 3600)
    return f"{seconds} s ({days} day{'s' if days > 1 else ''})"


def _bounds() -> str:
    rows = [
        ("nodes, elastic.minNodes, elastic.maxNodes", str(models.MAX_NODES)),
        ("nprocPerNode", str(models.MAX_PROCS_PER_NODE)),
        ("a container's nvidia.com/gpu (limits, requests)", str(models.MAX_GPUS_PER_POD)),
        (
            "runPolicy.activeDeadlineSeconds, runPolicy.ttlSecondsAfterFinished",
            _days(models.MAX_DURATION_SECONDS),
        ),
        (
            "rendezvous.joinTimeoutSeconds, rendezvous.dnsTimeoutSeconds, "
            "runPolicy.progressTimeoutSeconds, failurePolicy.backoffSeconds, "
            "failurePolicy.maxBackoffSeconds",
            _days(models.MAX_TIMEOUT_SECONDS),
        ),
        ("failurePolicy.maxRestarts, torchrun.maxRestarts", str(models.MAX_RESTARTS)),
    ]
    lines = ["| fields | at most |", "| --- | --- |"]
    return "\n".join(lines + [f"| {fields} | {bound} |" for fields, bound in rows])


HEADER = f"""# Bad input, and what the apiserver says

<!-- Generated by tests/integration/test_admission.py from tests/unit/api/bad_input.py; do
not edit. After changing the API or the cases, regenerate against the real apiserver:
{UPDATE_ENV}=1 LOCALKUBE_BIN=... python -m pytest tests/integration/test_admission.py -->

What `kubectl apply` of each bad DistributedTrainingJob gets from the apiserver (Kubernetes
1.37): each row is a good job with the changes shown. 422 is Invalid (the schema or a CEL rule
of the CRD), 400 a strict-decoding error (an unknown field). Invalid messages begin with
`DistributedTrainingJob.torchrun.dev "<name>" is invalid:`, left out here.

Rows that say "then update" are refused only as a change of an existing job: nodes,
nprocPerNode, elastic, template and rendezvous change only while the job is suspended, or in
the write that suspends or resumes it (as Kueue does; a resumed job starts a fresh attempt).
An elastic job that sets maxNodes may change nodes within its bounds at any time.

Every other row, except those about metadata.name, is also refused by the operator's own
model (`JobSpec.model_validate`), should a job get past admission: it then fails with reason
InvalidSpec. Not refused on purpose: a trainer's own `/dev/shm` mount (the operator keeps it
instead of adding its own).

The bounds (operator/torchrun_operator/api/bounds.py gives the reasons):

{_bounds()}

"""


def test_bad_input_table_is_current(refusals: dict[str, tuple[int, str]]) -> None:
    table = _table(refusals)
    if os.environ.get(UPDATE_ENV) == "1":
        TABLE.write_text(table)
    current = TABLE.read_text() if TABLE.exists() else ""
    assert current == table, (
        f"{TABLE.relative_to(REPO)} is out of date: rerun with {UPDATE_ENV}=1 and review the diff"
    )


# ---- what must still be accepted ------------------------------------------------------------


@pytest.fixture
def good(kube: client.ApiClient, namespace: str) -> dict[str, Any]:
    return create_job(kube, namespace, bad.apply(bad.GOOD, {"metadata.name": "ok"}))


def test_a_good_job_is_accepted_with_defaults(good: dict[str, Any]) -> None:
    spec = good["spec"]
    assert spec["runPolicy"]["suspend"] is False
    # What a runtime may default is left unset by the apiserver (api/crd.py RUNTIME_DEFAULTED):
    # written into the job, it would override the runtime's. The model's defaults apply.
    assert "rendezvous" not in spec and "failurePolicy" not in spec


def test_gpus_as_integers_or_plain_strings_are_accepted(
    kube: client.ApiClient, namespace: str
) -> None:
    for i, (limit, request) in enumerate([(8, None), ("8", 8), (8, "8"), (0, 0), ("64", None)]):
        resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": limit, "cpu": "500m"}}
        if request is not None:
            resources["requests"] = {"nvidia.com/gpu": request, "memory": "1Gi"}
        doc = bad.apply(
            bad.GOOD,
            {"metadata.name": f"gpu-{i}", f"{bad.TRAINER}.resources": resources},
        )
        create_job(kube, namespace, doc)


def test_own_volumes_and_shm_are_accepted(kube: client.ApiClient, namespace: str) -> None:
    doc = bad.apply(
        bad.GOOD,
        {
            f"{bad.TRAINER}.volumeMounts": [
                {"name": "shm", "mountPath": "/dev/shm"},
                {"name": "data", "mountPath": "/var/run/torchrun-data"},
                {"name": "data", "mountPath": "/opt/data"},
            ],
            "spec.template.spec.volumes": [
                {"name": "shm", "emptyDir": {"medium": "Memory"}},
                {"name": "data", "emptyDir": {}},
            ],
        },
    )
    create_job(kube, namespace, doc)


@pytest.mark.parametrize(
    ("changes", "update"),
    [
        # suspend and change in one write (Kueue's preemption restores the template so)
        ({}, {"spec.runPolicy.suspend": True, f"{bad.TRAINER}.image": "pytorch/pytorch:2"}),
        # resume and change in one write (Kueue's admission injects node selectors so)
        (
            {"spec.runPolicy.suspend": True},
            {
                "spec.runPolicy.suspend": False,
                "spec.nodes": 4,
                "spec.nprocPerNode": 8,
                "spec.rendezvous.port": 29500,
                "spec.template.spec.nodeSelector": {"pool": "a100"},
            },
        ),
        # change while suspended
        ({"spec.runPolicy.suspend": True}, {"spec.elastic": {"minNodes": 1, "maxNodes": 2}}),
        # an elastic job within its bounds
        ({"spec.elastic": {"minNodes": 1, "maxNodes": 4}}, {"spec.nodes": 4}),
        # what a running job may change
        (
            {},
            {
                "spec.failurePolicy.maxRestarts": 10,
                "spec.runPolicy.activeDeadlineSeconds": 3600,
                "spec.torchrun.maxRestarts": 2,
                "spec.successPolicy": "RankZero",
            },
        ),
    ],
    ids=["suspend-and-change", "resume-and-change", "while-suspended", "elastic", "policies"],
)
def test_allowed_changes_are_accepted(
    kube: client.ApiClient, namespace: str, changes: dict[str, Any], update: dict[str, Any]
) -> None:
    create_job(kube, namespace, bad.apply(bad.GOOD, {"metadata.name": "ok", **changes}))
    _update(kube, namespace, "ok", update)
