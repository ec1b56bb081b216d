"""The chart's example runtimes (charts/torchrun-operator/runtimes/, off by default) validate
against the runtime model, and each ten-line job of examples/runtimes/ merged onto its preset
validates against the job's model and renders the fabric's settings into its pods."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart import render
from torchrun_operator.api import names
from torchrun_operator.api.models import JobSpec
from torchrun_operator.api.runtime import RuntimeSpec
from torchrun_operator.api.runtimemerge import merge
from torchrun_operator.render import nproc_per_node, render_pod

ROOT = Path(__file__).resolve().parents[2]
PRESETS = {
    p.stem: yaml.safe_load(p.read_text())
    for p in sorted((ROOT / "charts" / "torchrun-operator" / "runtimes").glob("*.yaml"))
}
EXAMPLE_FILES = sorted((ROOT / "examples" / "runtimes").glob("*.yaml"))
EXAMPLES = {p.name: yaml.safe_load(p.read_text()) for p in EXAMPLE_FILES}


def test_there_are_the_four_presets_and_a_job_for_each() -> None:
    assert sorted(PRESETS) == [
        "torch-cpu-gloo",
        "torch-gpu",
        "torch-gpu-hostnetwork",
        "torch-gpu-rdma",
    ]
    named = sorted(doc["spec"]["runtimeRef"]["name"] for doc in EXAMPLES.values())
    assert named == sorted(PRESETS)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_jobs_are_about_ten_lines(path: Path) -> None:
    """The spec gives what differs from the runtime, and no more: ten lines at most."""
    text = path.read_text()
    spec = text[text.index("\nspec:\n") :].splitlines()[2:]
    assert len([x for x in spec if x.strip() and not x.lstrip().startswith("#")]) <= 10


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_validates_against_the_runtime_model(name: str) -> None:
    preset = PRESETS[name]
    assert preset["kind"] == names.CLUSTER_RUNTIME_KIND and preset["metadata"]["name"] == name
    RuntimeSpec.model_validate(preset["spec"])


def _merged(example: str) -> dict[str, Any]:
    job = copy.deepcopy(EXAMPLES[example])
    preset = PRESETS[job["spec"]["runtimeRef"]["name"]]
    job["spec"] = merge(preset["spec"], job["spec"])
    job["metadata"].update(namespace="ns", uid="uid-1")
    JobSpec.model_validate(job["spec"])
    return job


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_each_example_job_merged_onto_its_preset_is_a_valid_job(example: str) -> None:
    job = _merged(example)
    pod = render_pod(job, 0, 0)
    assert pod["spec"]["containers"][0]["image"]


def _trainer_env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def test_rdma_preset_passes_its_resource_nccl_ib_settings_and_ipc_lock_into_the_pods() -> None:
    job = _merged("gpu-rdma-job.yaml")
    pod = render_pod(job, 0, 0)
    trainer = pod["spec"]["containers"][0]
    assert trainer["resources"]["limits"]["rdma/ib"] == "1"
    assert "IPC_LOCK" in trainer["securityContext"]["capabilities"]["add"]
    env = _trainer_env(pod)
    assert env["NCCL_IB_HCA"] == "mlx5" and env["NCCL_IB_DISABLE"] == "0"
    assert nproc_per_node(job) == 8
    # /dev/shm stays memory-backed under a runtime: the operator's own volume.
    shm = next(m for m in trainer["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == shm["name"])
    assert volume["emptyDir"]["medium"] == "Memory"


def test_gpu_preset_gives_one_process_per_gpu_and_the_jobs_image_wins() -> None:
    job = _merged("gpu-job.yaml")
    pod = render_pod(job, 0, 0)
    assert nproc_per_node(job) == 8
    assert pod["spec"]["containers"][0]["image"] == "registry.example.com/team/llm-train:1.4"
    assert _trainer_env(pod)["NCCL_DEBUG"] == "WARN"


def test_hostnetwork_preset_runs_on_the_nodes_network_one_pod_per_node() -> None:
    job = _merged("gpu-hostnetwork-job.yaml")
    pod = render_pod(job, 0, 0)
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert JobSpec.model_validate(job["spec"]).scheduling.placement.one_pod_per_node


def test_chart_installs_the_presets_only_when_asked() -> None:
    assert not [o for o in render() if o["kind"] == names.CLUSTER_RUNTIME_KIND]
    objs = [
        o for o in render("runtimePresets.enabled=true") if o["kind"] == names.CLUSTER_RUNTIME_KIND
    ]
    assert sorted(o["metadata"]["name"] for o in objs) == sorted(PRESETS)
    for o in objs:
        assert o["spec"] == PRESETS[o["metadata"]["name"]]["spec"]  # as written, numbers too
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "torchrun-operator"
    some = render("runtimePresets.enabled=true", "runtimePresets.names={torch-gpu}")
    assert [o["metadata"]["name"] for o in some if o["kind"] == names.CLUSTER_RUNTIME_KIND] == [
        "torch-gpu"
    ]
