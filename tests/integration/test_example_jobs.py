"""Every example manifest is applied to the real apiserver; the CPU ones run to the end.

(`cpu-ddp.yaml` and `fail-rank3.yaml` run in test_operator_jobs.py.)
"""

from __future__ import annotations

from typing import Any

import pytest
from dtj import GROUP, PLURAL, REPO, VERSION, apply, load_docs, wait_phase
from kubernetes import client
from torchrun_operator.render import nproc_per_node, render_pod, world_size

EXAMPLES = REPO / "examples"


@pytest.mark.usefixtures("operator")
def test_configmap_script_example_runs_on_any_torch_image(
    kube: client.ApiClient, namespace: str
) -> None:
    job = apply(kube, namespace, load_docs(EXAMPLES / "configmap-script.yaml"))
    done = wait_phase(kube, namespace, job["metadata"]["name"], {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]


@pytest.mark.usefixtures("crd")
def test_gpu_example_is_accepted_and_asks_for_whole_gpu_nodes(
    kube: client.ApiClient, namespace: str
) -> None:
    # No GPUs here: the apiserver validates and defaults the job (a server-side dry run) and
    # the renderer shows what would run. The real NCCL run is bench/gpu_bench.py's business.
    doc = next(
        d for d in load_docs(EXAMPLES / "gpu-ddp.yaml") if d["kind"] == "DistributedTrainingJob"
    )
    admitted: Any = client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, doc, dry_run="All", field_validation="Strict"
    )
    admitted["metadata"].setdefault("uid", "dry-run-uid")
    assert nproc_per_node(admitted) == 8
    assert world_size(admitted) == 16
    pod = render_pod(admitted, 0, 0)
    trainer = pod["spec"]["containers"][0]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "8"
    args = trainer["args"]
    assert args[args.index("--nproc-per-node") + 1] == "8"
