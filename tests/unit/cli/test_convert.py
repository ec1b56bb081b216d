"""kubectl dtj convert: Kubeflow PyTorchJobs as DistributedTrainingJobs (docs/migrating.md).

The published examples of Kubeflow's training-operator v1.9 (read from the Go module cache,
tests/kubeflow_examples.py) convert to valid jobs; every field that does not carry over is
warned about."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import kubeflow_examples
import pytest
import yaml
from kubeflow_examples import example
from torchrun_operator.api.models import JobSpec
from torchrun_operator.api.runtimemerge import merge
from torchrun_operator.cli import convert
from torchrun_operator.cli.main import main

EXAMPLES = sorted(kubeflow_examples.EXAMPLES)
# What the images' ENTRYPOINTs run (their Dockerfiles, next to the examples), for the
# examples whose containers have args only.
ENTRYPOINTS = {
    "mnist-pytorch_job_mnist_gloo.yaml": ["python", "/opt/mnist/src/mnist.py"],
    "mnist-pytorch_job_mnist_nccl.yaml": ["python", "/opt/mnist/src/mnist.py"],
    "mnist-pytorch_job_mnist_mpi.yaml": ["python", "/opt/mnist/src/mnist.py"],
    "smoke-dist-pytorch_job_sendrecv.yaml": ["python", "/opt/mlkube/dist_sendrecv.py"],
}


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(example(name).read_text())
    return doc


def test_the_examples_are_there() -> None:
    assert len(EXAMPLES) == 9
    for name in EXAMPLES:
        assert yaml.safe_load(example(name).read_text())["kind"] == "PyTorchJob"


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_converts_to_a_valid_job(name: str) -> None:
    doc = load(name)
    result = convert.convert(doc, ENTRYPOINTS.get(name))
    job = result.job
    assert job["apiVersion"] == "torchrun.dev/v1alpha1"
    assert job["kind"] == "DistributedTrainingJob"
    assert job["metadata"]["name"] == doc["metadata"]["name"]
    spec = JobSpec.model_validate(job["spec"])
    assert convert.validate(job) is None
    replicas = doc["spec"]["pytorchReplicaSpecs"]
    assert spec.nodes == sum(r.get("replicas", 1) for r in replicas.values())
    source = replicas.get("Master") or replicas["Worker"]
    want = copy.deepcopy(source["template"]["spec"]["containers"][0])
    got = job["spec"]["template"]["spec"]["containers"][0]
    assert got["image"] == want["image"]
    assert got.get("args") == want.get("args")
    # every example restarts OnFailure by default: the change of meaning is said
    assert any("OnFailure restarted a pod after any failure" in w for w in result.warnings)


# What each example becomes, beyond validity.
EXPECTED: dict[str, dict[str, Any]] = {
    "cpu-demo-demo.yaml": {"nodes": 2, "nprocPerNode": 2, "command": ["torchrun", "demo.py"]},
    "deepspeed-demo-pytorch_deepspeed_demo.yaml": {"nodes": 2, "nprocPerNode": "gpu"},
    "elastic-echo-echo.yaml": {
        "nodes": 2,
        "elastic": {"minNodes": 1, "maxNodes": 2},
        "torchrun": {"maxRestarts": 100},
        "nprocPerNode": 1,
        "command": ["python", "-m", "torch.distributed.run", "./echo.py"],
    },
    "elastic-imagenet-imagenet.yaml": {
        "nodes": 2,
        "elastic": {"minNodes": 1, "maxNodes": 3},
        "torchrun": {"maxRestarts": 100},
    },
    "mnist-pytorch_job_mnist_gloo.yaml": {
        "nodes": 2,
        "nprocPerNode": 1,
        "command": ["python", "/opt/mnist/src/mnist.py"],
    },
    "simple.yaml": {"nodes": 2, "nprocPerNode": 1},
    "smoke-dist-pytorch_job_sendrecv.yaml": {"nodes": 4, "nprocPerNode": 1},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_what_the_examples_become(name: str) -> None:
    result = convert.convert(load(name), ENTRYPOINTS.get(name))
    spec = result.job["spec"]
    expected = dict(EXPECTED[name])
    command = expected.pop("command", None)
    for key, value in expected.items():
        assert spec.get(key) == value, (key, spec)
    if command is not None:
        assert spec["template"]["spec"]["containers"][0]["command"] == command
    # PyTorchJob's cleanPodPolicy defaults to None: every pod is kept
    assert spec["runPolicy"]["cleanPodPolicy"] == "KeepAll"


def test_the_echo_examples_rendezvous_flag_goes_and_is_said() -> None:
    result = convert.convert(load("elastic-echo-echo.yaml"))
    assert any("--rdzv_backend=c10d removed" in w for w in result.warnings)
    assert any(
        "HorizontalPodAutoscaler" in w
        for w in convert.convert(load("elastic-imagenet-imagenet.yaml")).warnings
    )


def test_a_missing_command_is_a_placeholder_and_an_error() -> None:
    result = convert.convert(load("mnist-pytorch_job_mnist_gloo.yaml"))
    container = result.job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [convert.TODO_COMMAND]
    assert list(container)[:4] == ["name", "image", "command", "args"]
    (error,) = result.errors
    assert "--entrypoint" in error
    assert not any("--entrypoint" in w for w in result.warnings)


# ---- the mapping, field by field -------------------------------------------------------------


def pytorchjob(**spec: Any) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "img", "command": ["python", "train.py"]}
    replica = {
        "replicas": 1,
        "restartPolicy": "ExitCode",
        "template": {"spec": {"containers": [container]}},
    }
    doc: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "job", "namespace": "ml"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": replica,
                "Worker": {**copy.deepcopy(replica), "replicas": 3},
            }
        },
    }
    for key, value in spec.items():
        doc["spec"][key] = value
    return doc


def test_exit_code_policy_is_the_operators_own_rule_and_needs_no_warning() -> None:
    result = convert.convert(pytorchjob())
    assert result.warnings == []
    spec = result.job["spec"]
    assert spec["nodes"] == 4
    assert "failurePolicy" not in spec  # exit 1-127 fail the job, 128-255 restart it
    assert result.job["metadata"] == {"name": "job", "namespace": "ml"}


@pytest.mark.parametrize(
    ("clean", "expected", "warns"),
    [
        (None, "KeepAll", False),
        ("None", "KeepAll", False),
        ("All", "Delete", False),
        ("Running", "KeepFailed", True),
    ],
)
def test_clean_pod_policy(clean: str | None, expected: str, warns: bool) -> None:
    run = {} if clean is None else {"cleanPodPolicy": clean}
    result = convert.convert(pytorchjob(runPolicy=run))
    assert result.job["spec"]["runPolicy"]["cleanPodPolicy"] == expected
    assert any("cleanPodPolicy" in w for w in result.warnings) == warns


def test_run_policy_fields() -> None:
    run = {
        "ttlSecondsAfterFinished": 600,
        "activeDeadlineSeconds": 3600,
        "backoffLimit": 5,
        "suspend": True,
        "schedulingPolicy": {"minAvailable": 4, "queue": "q"},
        "managedBy": "kubeflow.org/training-operator",
    }
    result = convert.convert(pytorchjob(runPolicy=run))
    spec = result.job["spec"]
    assert spec["runPolicy"] == {
        "cleanPodPolicy": "KeepAll",
        "ttlSecondsAfterFinished": 600,
        "activeDeadlineSeconds": 3600,
        "suspend": True,
    }
    assert spec["failurePolicy"] == {"maxRestarts": 5}
    assert any(w.startswith("spec.runPolicy.schedulingPolicy:") for w in result.warnings)
    assert any(w.startswith("spec.runPolicy.managedBy:") for w in result.warnings)
    JobSpec.model_validate(spec)


@pytest.mark.parametrize(
    ("policy", "scheduler", "scheduling", "says"),
    [
        (
            {"queue": "research", "minAvailable": 4},
            None,
            {"gang": "Volcano", "queue": "research"},
            "Volcano",
        ),
        ({"minAvailable": 4}, "volcano", {"gang": "Volcano"}, "schedulerName volcano"),
        (
            {"scheduleTimeoutSeconds": 120},
            None,
            {"gang": "Coscheduling", "scheduleTimeoutSeconds": 120},
            "Coscheduling",
        ),
        (
            {"minAvailable": 4},
            "scheduler-plugins-scheduler",
            {"gang": "Coscheduling"},
            "Coscheduling",
        ),
        ({"minAvailable": 4}, None, None, "set spec.scheduling.gang"),
        ({"queue": "q", "scheduleTimeoutSeconds": 60}, None, None, "set spec.scheduling.gang"),
    ],
)
def test_scheduling_policy_becomes_spec_scheduling(
    policy: dict[str, Any], scheduler: str | None, scheduling: dict[str, Any] | None, says: str
) -> None:
    """The PyTorchJob does not say which gang scheduler the training operator ran
    (--gang-scheduler-name); what is Volcano's or coscheduling's alone says it."""
    doc = pytorchjob(runPolicy={"schedulingPolicy": policy})
    if scheduler is not None:
        for r in doc["spec"]["pytorchReplicaSpecs"].values():
            r["template"]["spec"]["schedulerName"] = scheduler
    result = convert.convert(doc)
    spec = result.job["spec"]
    assert spec.get("scheduling") == scheduling
    (said,) = [w for w in result.warnings if w.startswith("spec.runPolicy.schedulingPolicy:")]
    assert says in said and "creates no PodGroup" not in said
    JobSpec.model_validate(spec)


def test_scheduling_policy_priority_and_min_available() -> None:
    policy = {"queue": "q", "minAvailable": 2, "priorityClass": "high", "minResources": {"cpu": 8}}
    result = convert.convert(pytorchjob(runPolicy={"schedulingPolicy": policy}))
    spec = result.job["spec"]
    assert spec["template"]["spec"]["priorityClassName"] == "high"
    text = "\n".join(result.warnings)
    for said in ("schedulingPolicy.minAvailable", "schedulingPolicy.minResources", "priorityClass"):
        assert said in text
    # the template's own priority class wins, and is said to
    doc = pytorchjob(runPolicy={"schedulingPolicy": {"queue": "q", "priorityClass": "high"}})
    for r in doc["spec"]["pytorchReplicaSpecs"].values():
        r["template"]["spec"]["priorityClassName"] = "low"
    result = convert.convert(doc)
    assert result.job["spec"]["template"]["spec"]["priorityClassName"] == "low"
    assert any("priorityClass" in w and "low" in w for w in result.warnings)
    # minAvailable equal to the gang's size needs no word
    doc = pytorchjob(runPolicy={"schedulingPolicy": {"queue": "q", "minAvailable": 4}})
    assert not any("minAvailable" in w for w in convert.convert(doc).warnings)


@pytest.mark.parametrize(
    ("policy", "backoff", "max_restarts", "warns"),
    [
        ("OnFailure", 7, 7, True),
        ("Always", 2, 2, True),
        ("OnFailure", None, None, True),
        ("ExitCode", 4, 4, False),
        ("Never", None, 0, False),
        ("Never", 4, 0, True),
    ],
)
def test_restart_policy(
    policy: str, backoff: int | None, max_restarts: int | None, warns: bool
) -> None:
    doc = pytorchjob(runPolicy={} if backoff is None else {"backoffLimit": backoff})
    for r in doc["spec"]["pytorchReplicaSpecs"].values():
        r["restartPolicy"] = policy
    result = convert.convert(doc)
    assert result.job["spec"].get("failurePolicy", {}).get("maxRestarts") == max_restarts
    assert bool(result.warnings) == warns


def test_different_templates_and_policies_are_warned_about() -> None:
    doc = pytorchjob()
    worker = doc["spec"]["pytorchReplicaSpecs"]["Worker"]
    worker["restartPolicy"] = "Never"
    worker["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}}
    worker["template"]["spec"]["nodeSelector"] = {"pool": "b"}
    result = convert.convert(doc)
    (diff,) = [
        w for w in result.warnings if w.startswith("spec.pytorchReplicaSpecs.Worker.template")
    ]
    assert "containers[0].resources" in diff and "nodeSelector" in diff
    assert any("Worker.restartPolicy" in w for w in result.warnings)
    assert "nodeSelector" not in result.job["spec"]["template"]["spec"]


def test_worker_only_and_the_trainer_container_first() -> None:
    doc = pytorchjob()
    replicas = doc["spec"]["pytorchReplicaSpecs"]
    del replicas["Master"]
    replicas["worker"] = replicas.pop("Worker")  # any case, as the training operator accepts
    pod = replicas["worker"]["template"]["spec"]
    pod["containers"].insert(0, {"name": "sidecar", "image": "s", "command": ["sleep", "inf"]})
    pod["restartPolicy"] = "OnFailure"
    result = convert.convert(doc)
    spec = result.job["spec"]
    assert spec["nodes"] == 3
    assert [c["name"] for c in spec["template"]["spec"]["containers"]] == ["pytorch", "sidecar"]
    assert "restartPolicy" not in spec["template"]["spec"]
    assert any("moved first" in w for w in result.warnings)
    assert any("template.spec.restartPolicy" in w for w in result.warnings)


def test_launcher_flags_move_into_the_spec() -> None:
    doc = pytorchjob()
    for r in doc["spec"]["pytorchReplicaSpecs"].values():
        c = r["template"]["spec"]["containers"][0]
        c["command"] = ["torchrun", "--nnodes=4", "--nproc_per_node=8", "--max-restarts", "2"]
        c["args"] = [
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=$(MASTER_ADDR):29400",
            "train.py",
            "--nnodes",
            "x",
        ]
        c["env"] = [{"name": "PET_NNODES", "value": "4"}, {"name": "NCCL_DEBUG", "value": "INFO"}]
    result = convert.convert(doc)
    spec = result.job["spec"]
    c = spec["template"]["spec"]["containers"][0]
    assert c["command"] == ["torchrun"]
    assert c["args"] == ["train.py", "--nnodes", "x"]  # the script's own arguments stay
    assert c["env"] == [{"name": "NCCL_DEBUG", "value": "INFO"}]
    assert spec["nprocPerNode"] == 8
    assert spec["torchrun"] == {"maxRestarts": 2}
    JobSpec.model_validate(spec)
    text = "\n".join(result.warnings)
    for said in (
        "--nnodes=4 removed",
        "--nproc_per_node=8 moved",
        "--rdzv-backend=c10d removed",
        "PET_NNODES",
    ):
        assert said in text


@pytest.mark.parametrize(
    ("nproc", "command", "gpus", "expected"),
    [
        ("4", ["torchrun", "t.py"], None, 4),
        ("auto", ["torchrun", "t.py"], 8, "gpu"),
        (None, ["torchrun", "t.py"], 8, "gpu"),
        ("gpu", ["torchrun", "t.py"], 8, "gpu"),
        ("auto", ["torchrun", "t.py"], None, 1),
        ("cpu", ["torchrun", "t.py"], None, 1),
        ("4", ["python", "t.py"], 8, 1),  # no torchrun: one process per pod
        (None, ["python", "t.py"], 8, 1),
    ],
)
def test_nproc_per_node(
    nproc: str | None, command: list[str], gpus: int | None, expected: Any
) -> None:
    doc = pytorchjob(**({} if nproc is None else {"nprocPerNode": nproc}))
    for r in doc["spec"]["pytorchReplicaSpecs"].values():
        c = r["template"]["spec"]["containers"][0]
        c["command"] = command
        if gpus:
            c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    result = convert.convert(doc)
    assert result.job["spec"]["nprocPerNode"] == expected
    JobSpec.model_validate(result.job["spec"])


def test_elastic_policy() -> None:
    elastic = {
        "minReplicas": 2,
        "maxReplicas": 8,
        "maxRestarts": 5,
        "rdzvBackend": "etcd",
        "rdzvPort": 29500,
        "rdzvHost": "etcd",
        "rdzvConf": [
            {"key": "join_timeout", "value": "120"},
            {"key": "read_timeout", "value": "60"},
        ],
        "nProcPerNode": 2,
    }
    doc = pytorchjob(elasticPolicy=elastic)
    for r in doc["spec"]["pytorchReplicaSpecs"].values():
        r["template"]["spec"]["containers"][0]["command"] = ["torchrun", "t.py"]
    result = convert.convert(doc)
    spec = result.job["spec"]
    assert spec["elastic"] == {"minNodes": 2, "maxNodes": 8}
    assert spec["torchrun"] == {"maxRestarts": 5}
    assert spec["rendezvous"] == {"port": 29500, "joinTimeoutSeconds": 120}
    assert spec["nprocPerNode"] == 2
    text = "\n".join(result.warnings)
    assert "rdzvBackend" in text and "rdzvHost" in text and "read_timeout=60" in text
    JobSpec.model_validate(spec)


def test_elastic_bounds_take_nodes_in() -> None:
    result = convert.convert(pytorchjob(elasticPolicy={"minReplicas": 1, "maxReplicas": 2}))
    assert result.job["spec"]["nodes"] == 2
    assert any("outside minReplicas..maxReplicas" in w for w in result.warnings)


def test_unknown_and_uncarried_fields_are_named() -> None:
    doc = pytorchjob(frobnicate=1)
    doc["spec"]["pytorchReplicaSpecs"]["Chief"] = {"replicas": 1}
    doc["metadata"].update(
        uid="x",
        resourceVersion="1",
        creationTimestamp="t",
        finalizers=["f"],
        annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "a"},
        labels={"kueue.x-k8s.io/queue-name": "q"},
    )
    doc["status"] = {"conditions": []}
    result = convert.convert(doc)
    text = "\n".join(result.warnings)
    for said in ("spec.frobnicate", "pytorchReplicaSpecs.Chief", "metadata.finalizers", "Kueue"):
        assert said in text
    assert "uid" not in text and "resourceVersion" not in text
    assert result.job["metadata"]["annotations"] == {"team": "a"}
    assert "status" not in result.job


def test_a_name_that_cannot_be_a_job_name_is_warned_about() -> None:
    doc = pytorchjob()
    doc["metadata"]["name"] = "1st.job"
    assert any("DNS-1035" in w for w in convert.convert(doc).warnings)


@pytest.mark.parametrize(
    "doc",
    [
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "spec": {}},
        {"apiVersion": "kubeflow.org/v2alpha1", "kind": "PyTorchJob", "spec": {}},
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "spec": {"pytorchReplicaSpecs": {}},
        },
    ],
)
def test_what_is_not_a_pytorchjob_is_an_error(doc: dict[str, Any]) -> None:
    with pytest.raises(convert.ConvertError):
        convert.convert(doc)


# ---- the command -----------------------------------------------------------------------------


def test_cli_converts_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "-f", str(example("cpu-demo-demo.yaml"))]) == 0
    out, err = capsys.readouterr()
    (job,) = list(yaml.safe_load_all(out))
    assert job["kind"] == "DistributedTrainingJob" and job["spec"]["nodes"] == 2
    assert err.startswith("warning: PyTorchJob torchrun-cpu: ")


def test_cli_reads_stdin_and_several_documents(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        (example("simple.yaml")).read_text() + "---\n" + (example("cpu-demo-demo.yaml")).read_text()
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["convert"]) == 0
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert names == ["pytorch-simple", "torchrun-cpu"]


def test_cli_json_and_entrypoint(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(example("mnist-pytorch_job_mnist_gloo.yaml"))
    assert (
        main(
            ["convert", "-f", path, "-o", "json", "--entrypoint", "python /opt/mnist/src/mnist.py"]
        )
        == 0
    )
    job = json.loads(capsys.readouterr().out)
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "python",
        "/opt/mnist/src/mnist.py",
    ]


def test_cli_fails_when_the_result_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = pytorchjob()
    for r in doc["spec"]["pytorchReplicaSpecs"].values():
        r["template"]["spec"]["containers"][0]["command"] = ["torchrun", "--frobnicate", "t.py"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["convert", "-f", str(path)]) == 1
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["kind"] == "DistributedTrainingJob"  # printed, to be edited
    assert "not a valid DistributedTrainingJob" in err and "--frobnicate" in err


def test_cli_refuses_other_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    assert main(["convert", "-f", str(path)]) == 1
    assert "not a kubeflow.org/v1 PyTorchJob" in capsys.readouterr().err


def test_cli_converts_onto_a_runtime_keeping_only_what_differs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--runtime with --runtime-file (no cluster): the job names the runtime, its trainer takes
    the runtime's trainer's name, and what the runtime gives already is left out."""
    doc = load("cpu-demo-demo.yaml")
    whole = convert.convert(doc).job
    trainer = whole["spec"]["template"]["spec"]["containers"][0]
    runtime_spec: dict[str, Any] = {
        "template": {"spec": {"containers": [{"name": "trainer", "image": trainer["image"]}]}}
    }
    runtime = {
        "apiVersion": "torchrun.dev/v1alpha1",
        "kind": "ClusterDistributedTrainingRuntime",
        "metadata": {"name": "cpu"},
        "spec": runtime_spec,
    }
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump(runtime))
    argv = ["convert", "-f", str(example("cpu-demo-demo.yaml"))]
    assert main([*argv, "--runtime", "cpu", "--runtime-file", str(path)]) == 0
    out, _ = capsys.readouterr()
    (job,) = list(yaml.safe_load_all(out))
    assert job["spec"]["runtimeRef"] == {"name": "cpu"}
    (mine,) = job["spec"]["template"]["spec"]["containers"]
    assert mine["name"] == "trainer" and "image" not in mine  # the runtime's image
    assert mine["command"] == trainer["command"] and job["spec"]["nodes"] == 2
    # Merged onto the runtime, it is the whole conversion again, the trainer renamed.
    renamed = copy.deepcopy(whole["spec"])
    renamed["template"]["spec"]["containers"][0]["name"] = "trainer"
    merged = merge(runtime_spec, job["spec"])
    assert {k: v for k, v in merged.items() if k != "runtimeRef"} == renamed
