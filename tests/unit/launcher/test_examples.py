"""The example manifests are current with examples/scripts/ and valid against the API models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from torchrun_operator.api.models import JobSpec

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
MANIFESTS = [
    "cpu-ddp.yaml",
    "gpu-ddp.yaml",
    "configmap-script.yaml",
    "fail-rank3.yaml",
    "progress.yaml",
    "checkpoint.yaml",
]


def test_manifests_are_generated_from_current_scripts() -> None:
    check = subprocess.run(
        [sys.executable, str(EXAMPLES / "gen.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_is_a_valid_job_with_its_script(name: str) -> None:
    cm, job = yaml.safe_load_all((EXAMPLES / name).read_text())
    assert (cm["kind"], job["kind"]) == ("ConfigMap", "DistributedTrainingJob")
    assert job["apiVersion"] == "torchrun.dev/v1alpha1"
    spec = JobSpec.model_validate(job["spec"])
    # the script, and the module every script imports from its own directory
    script_name, shared = cm["data"]
    assert shared == "torchrun_example.py"
    for file, text in cm["data"].items():
        assert text == (EXAMPLES / "scripts" / file).read_text()
        compile(text, file, "exec")
    # the trainer runs the mounted script from the ConfigMap defined next to it
    assert spec.trainer.command == ["python", f"/workspace/{script_name}"]
    volumes = job["spec"]["template"]["spec"]["volumes"]
    assert {"name": "script", "configMap": {"name": cm["metadata"]["name"]}} in volumes
