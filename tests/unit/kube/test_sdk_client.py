"""torchrun_operator.client (the SDK) against the fake transport: the requests it sends and
what it makes of the answers, as a notebook user sees them."""

from __future__ import annotations

import json
from typing import Any

import jobs
import pytest
from fake_transport import FakeTransport
from kubernetes import client
from torchrun_operator.api.models import JobSpec
from torchrun_operator.client import (
    Client,
    JobFailed,
    JobNotFound,
    LogsUnavailable,
    RankNotFound,
    WaitTimeout,
)

HOST = "https://apiserver.test"
JOBS = "/apis/torchrun.dev/v1alpha1/namespaces/ns/distributedtrainingjobs"


def sdk(t: FakeTransport) -> Client:
    api = client.ApiClient(client.Configuration(host=HOST))
    api.rest_client = t  # type: ignore[assignment]  # it answers what ApiClient asks
    return Client(api, namespace="ns")


def obj(phase: str | None = None, rv: str = "1", **status: Any) -> dict[str, Any]:
    doc = jobs.job("train", metadata={"namespace": "ns", "uid": "u1", "resourceVersion": rv})
    if phase:
        doc["status"] = {"phase": phase, **status}
    return doc


def events(*pairs: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(json.dumps({"type": k, "object": o}).encode() + b"\n" for k, o in pairs)


def paths(t: FakeTransport) -> list[tuple[str, str]]:
    return [(s.method, s.url.removeprefix(HOST).split("?")[0]) for s in t.sent]


def test_submit_a_spec_posts_only_what_was_set_and_returns_the_typed_job() -> None:
    t = FakeTransport(answers=[(201, obj())])  # Created, as the apiserver answers
    spec = JobSpec.model_validate(jobs.job()["spec"])
    job = sdk(t).submit(spec, name="train")
    assert paths(t) == [("POST", JOBS)]
    sent = t.sent[0].body
    assert (
        sent["apiVersion"] == "torchrun.dev/v1alpha1" and sent["kind"] == "DistributedTrainingJob"
    )
    assert sent["metadata"] == {"name": "train", "namespace": "ns"}
    # camelCase, no defaults filled in (the CRD's defaults apply, as for YAML)
    assert sent["spec"] == jobs.job()["spec"]
    assert (job.name, job.namespace, job.uid) == ("train", "ns", "u1")
    assert job.spec.nodes == 2 and job.phase == "Pending" and not job.finished


def test_submit_a_dict_validates_it_before_anything_is_sent() -> None:
    t = FakeTransport(answers=[(201, obj())])
    bad = jobs.job("train", nodes=0)
    with pytest.raises(ValueError, match="nodes"):
        sdk(t).submit(bad)
    with pytest.raises(ValueError, match="needs a name"):
        sdk(t).submit({"spec": jobs.job()["spec"]})
    assert t.sent == []
    sdk(t).submit(jobs.job("train"))
    assert t.sent[0].body["metadata"]["name"] == "train"


RUNTIME = "/apis/torchrun.dev/v1alpha1/clusterdistributedtrainingruntimes/cpu"


def _runtime_job(**container: Any) -> dict[str, Any]:
    """A job that leaves the image (and all else but the command) to the runtime `cpu`, as
    `kubectl dtj run --runtime cpu` submits it."""
    trainer = {"name": "trainer", "command": ["python", "train.py"], **container}
    return {
        "metadata": {"name": "train"},
        "spec": {
            "runtimeRef": {"name": "cpu"},
            "nodes": 1,
            "template": {"spec": {"containers": [trainer]}},
        },
    }


def test_submit_a_job_on_a_runtime_validates_it_merged_onto_the_runtime() -> None:
    """A job that names a runtime may leave the image to it: the runtime is read and the merge
    validated (before, the job alone was validated: 'image: Field required', a traceback in
    `kubectl dtj run --runtime`)."""
    template = jobs.job()["spec"]["template"]
    del template["spec"]["containers"][0]["command"]
    runtime = {"kind": "ClusterDistributedTrainingRuntime", "spec": {"template": template}}
    created = {**_runtime_job(), "metadata": {"name": "train", "namespace": "ns", "uid": "u"}}
    t = FakeTransport(answers=[(200, runtime), (201, created)])
    job = sdk(t).submit(_runtime_job())
    assert paths(t) == [("GET", RUNTIME), ("POST", JOBS)]
    assert "image" not in t.sent[1].body["spec"]["template"]["spec"]["containers"][0]
    # the job handed back is the merge the operator will run (the apiserver's answer lacks
    # the image: before, reading it back raised 'image: Field required')
    (trainer,) = job.spec.template.spec.containers
    assert trainer.image == template["spec"]["containers"][0]["image"]
    assert trainer.command == ["python", "train.py"]
    # what the merge lacks is named with where it came from, and nothing is sent
    bare = {
        "kind": "ClusterDistributedTrainingRuntime",
        "spec": {"template": {"spec": {"containers": [{"name": "trainer"}]}}},
    }
    t = FakeTransport(answers=[(200, bare)])
    with pytest.raises(ValueError, match=r"containers\[0\]\.image .*Field required"):
        sdk(t).submit(_runtime_job())
    assert paths(t) == [("GET", RUNTIME)]


@pytest.mark.parametrize("status", [403, 404])
def test_submit_on_a_runtime_it_cannot_read_leaves_the_merge_to_the_operator(status: int) -> None:
    """Not there yet (the job waits for it) or not readable with these credentials: the job
    is submitted; the operator validates the merge and fails the job naming the field."""
    t = FakeTransport(answers=[(status, {"kind": "Status"}), (201, obj())])
    sdk(t).submit(_runtime_job())
    assert paths(t) == [("GET", RUNTIME), ("POST", JOBS)]


def test_get_list_and_delete() -> None:
    t = FakeTransport(
        answers=[
            (200, obj("Running")),
            (200, {"items": [obj("Running"), obj("Failed")]}),
            (200, {"kind": "Status", "status": "Success"}),
            (404, {"kind": "Status", "code": 404}),
            (404, {"kind": "Status", "code": 404}),
        ]
    )
    c = sdk(t)
    assert c.get("train").phase == "Running"
    assert [j.phase for j in c.list()] == ["Running", "Failed"]
    c.delete("train")
    with pytest.raises(JobNotFound, match="'gone' not found in namespace 'ns'"):
        c.delete("gone")
    with pytest.raises(JobNotFound):
        c.get("gone")
    assert paths(t) == [
        ("GET", JOBS + "/train"),
        ("GET", JOBS),
        ("DELETE", JOBS + "/train"),
        ("DELETE", JOBS + "/gone"),
        ("GET", JOBS + "/gone"),
    ]
    assert "propagationPolicy=Background" in t.sent[2].url


def test_watch_yields_each_status_change_once_and_ends_when_the_job_is_deleted() -> None:
    running = obj("Running", rv="2")
    t = FakeTransport(
        answers=[
            (200, obj("Starting")),
            (
                200,
                events(
                    ("MODIFIED", running),
                    ("MODIFIED", obj("Running", rv="3")),  # metadata only: not a change
                    ("MODIFIED", obj("Restarting", rv="4")),
                ),
            ),
            # the apiserver ended that watch; the next one resumes from version 4
            (200, events(("DELETED", obj("Restarting", rv="5")))),
        ]
    )
    seen = [j.phase for j in sdk(t).watch("train")]
    assert seen == ["Starting", "Running", "Restarting"]
    watches = [s.url for s in t.sent[1:]]
    assert all("watch=true" in u and "fieldSelector=metadata.name%3Dtrain" in u for u in watches)
    assert "resourceVersion=1" in watches[0] and "resourceVersion=4" in watches[1]


def test_watch_reads_anew_when_its_version_expired() -> None:
    gone = {"kind": "Status", "code": 410, "reason": "Expired"}
    t = FakeTransport(
        answers=[
            (200, obj("Running")),
            (200, events(("ERROR", gone))),
            (200, obj("Succeeded", rv="9")),
            (200, events(("DELETED", obj("Succeeded", rv="10")))),
        ]
    )
    assert [j.phase for j in sdk(t).watch("train")] == ["Running", "Succeeded"]
    assert paths(t)[2] == ("GET", JOBS + "/train")


def test_wait_returns_the_final_status_of_a_job_that_succeeded() -> None:
    t = FakeTransport(
        answers=[(200, obj("Running")), (200, events(("MODIFIED", obj("Succeeded", rv="2"))))]
    )
    status = sdk(t).wait("train", timeout=60)
    assert status.phase == "Succeeded"


def test_wait_raises_the_root_cause_of_a_job_that_failed() -> None:
    failure = {
        "rank": 3,
        "pod": "train-1",
        "node": "n2",
        "exitCode": 1,
        "reason": "Error",
        "message": "RuntimeError: rank 3 failed on purpose",
    }
    t = FakeTransport(
        answers=[(200, obj("Running")), (200, events(("MODIFIED", obj("Failed", failure=failure))))]
    )
    with pytest.raises(JobFailed) as err:
        sdk(t).wait("train")
    assert str(err.value) == (
        "job train failed (Error) at rank 3, pod train-1, node n2, exit code 1: "
        "RuntimeError: rank 3 failed on purpose"
    )
    assert err.value.failure is not None and err.value.failure.rank == 3
    assert err.value.job.phase == "Failed"


def test_wait_times_out_with_the_job_as_last_seen() -> None:
    t = FakeTransport(answers=[(200, obj("Running"))], body=b"")  # watches end with no event
    with pytest.raises(WaitTimeout, match=r"within 0\.2s \(phase Running\)") as err:
        sdk(t).wait("train", timeout=0.2)
    assert err.value.job is not None and err.value.job.phase == "Running"


def test_wait_on_a_job_deleted_meanwhile_says_so() -> None:
    t = FakeTransport(answers=[(200, obj("Running")), (200, events(("DELETED", obj("Running"))))])
    with pytest.raises(JobNotFound):
        sdk(t).wait("train")


RANKS = [
    {"index": 0, "pod": "train-0", "node": "n1", "globalRanks": "4-7"},
    {"index": 1, "pod": "train-1", "node": "n2", "globalRanks": "0-3"},
]


def test_logs_come_from_the_trainer_of_the_pod_holding_the_rank_line_by_line() -> None:
    t = FakeTransport(
        answers=[(200, obj("Running", ranks=RANKS)), (200, b"step 1\nstep 2\npartial")]
    )
    lines = list(sdk(t).logs("train", rank=2, follow=True))
    assert lines == ["step 1", "step 2", "partial"]
    assert paths(t)[1] == ("GET", "/api/v1/namespaces/ns/pods/train-1/log")
    assert "container=trainer" in t.sent[1].url and "follow=true" in t.sent[1].url


def test_logs_with_follow_wait_for_the_rendezvous_that_assigns_the_rank() -> None:
    before = [dict(r, globalRanks=None) for r in RANKS]
    t = FakeTransport(
        answers=[
            (200, obj("Starting", ranks=before)),
            (200, obj("Starting", ranks=before)),
            (200, events(("MODIFIED", obj("Running", rv="2", ranks=RANKS)))),
            (200, b"hello\n"),
        ]
    )
    assert list(sdk(t).logs("train", rank=5, follow=True)) == ["hello"]
    assert paths(t)[-1] == ("GET", "/api/v1/namespaces/ns/pods/train-0/log")


def test_logs_of_an_unknown_rank_or_an_unreadable_pod_say_which() -> None:
    t = FakeTransport(answers=[(200, obj("Running", ranks=RANKS, worldSize=8))])
    with pytest.raises(RankNotFound, match=r"no global rank 8 \(world size 8\)"):
        list(sdk(t).logs("train", rank=8))
    t = FakeTransport(
        answers=[(200, obj("Running", ranks=RANKS)), (500, {"message": "no kubelet"})]
    )
    with pytest.raises(LogsUnavailable, match=r"pod train-1 \(node n2\) holding rank 0") as err:
        list(sdk(t).logs("train"))
    assert err.value.status == 500 and err.value.entry.pod == "train-1"


def test_client_without_an_api_client_reads_the_kubeconfig(tmp_path: Any, monkeypatch: Any) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://k.test:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team"}}
                ],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    c = Client()
    assert c.namespace == "team"
    assert c.api_client.configuration.host == "https://k.test:6443"
    assert Client(namespace="other").namespace == "other"
    # the kubernetes package's global configuration is left alone
    assert client.Configuration.get_default_copy().host != "https://k.test:6443"


def test_fields_of_a_newer_operator_are_left_out_not_refused() -> None:
    newer = obj("Failed", failure={"rank": 1, "stackDump": "..."}, futureField={"x": 1})
    newer["spec"]["runtimeRef"] = {"name": "torch-2.16"}
    job = sdk(FakeTransport(answers=[(200, newer)])).get("train")
    assert job.phase == "Failed" and job.status.failure is not None
    assert job.status.failure.rank == 1
    assert job.raw["status"]["futureField"] == {"x": 1}  # still there, untyped


def test_kubectl_dtj_run_on_a_runtime_the_merge_refuses_is_an_error_line_not_a_traceback(
    tmp_path: Any,
) -> None:
    """`kubectl dtj run --runtime` whose merged job is invalid: RunError (main prints it as one
    `error:` line), and the ConfigMap made for the script is deleted again."""
    from torchrun_operator.cli import run as run_cmd
    from torchrun_operator.cli.main import build_parser

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    args = build_parser().parse_args(["run", "--runtime", "cpu", "--name", "t", str(script)])
    bare = {"spec": {"template": {"spec": {"containers": [{"name": "trainer"}]}}}}
    cm = {"kind": "ConfigMap", "metadata": {"name": "t-code", "namespace": "ns"}}
    t = FakeTransport(answers=[(201, cm), (200, bare), (200, {"kind": "Status"})])
    with pytest.raises(run_cmd.RunError, match=r"not valid: .*image .*Field required"):
        run_cmd.run(args, sdk(t), "ns")
    assert paths(t) == [
        ("POST", "/api/v1/namespaces/ns/configmaps"),
        ("GET", RUNTIME),
        ("DELETE", "/api/v1/namespaces/ns/configmaps/t-code"),
    ]


def test_a_job_on_a_runtime_reads_back_merged_onto_what_the_operator_recorded() -> None:
    """get/list/watch hand out a runtime job's spec as the operator runs it: merged onto
    status.runtime's record; before the operator resolved it, what the runtime gives reads as
    UNRESOLVED instead of failing the read."""
    from torchrun_operator.client.job import UNRESOLVED, Job

    doc = _runtime_job()
    pending = Job.from_object(doc)
    (trainer,) = pending.spec.template.spec.containers
    assert (trainer.image, trainer.command) == (UNRESOLVED, ["python", "train.py"])
    record = {"template": {"spec": {"containers": [{"name": "trainer", "image": "rt:1"}]}}}
    doc["status"] = {"phase": "Running", "runtime": {"kind": "K", "name": "cpu", "spec": record}}
    (trainer,) = Job.from_object(doc).spec.template.spec.containers
    assert (trainer.image, trainer.command) == ("rt:1", ["python", "train.py"])
