"""deploy/install.yaml (for `kubectl apply` without Helm) is what the chart renders today."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "install.yaml"


def test_install_manifest_is_current(tmp_path: Path) -> None:
    fresh = tmp_path / "install.yaml"
    proc = subprocess.run(
        [str(ROOT / "hack" / "gen-install-manifest.sh"), str(fresh)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert MANIFEST.read_text() == fresh.read_text(), (
        "deploy/install.yaml is stale: run hack/gen-install-manifest.sh"
    )


def test_install_manifest_creates_namespace_and_crd_before_the_operator() -> None:
    objs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    kinds = [o["kind"] for o in objs]
    assert kinds[:4] == ["Namespace", *["CustomResourceDefinition"] * 3]
    namespace = objs[0]
    assert namespace["metadata"]["name"] == "torchrun-system"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {o["metadata"]["name"] for o in objs[1:4]} == {
        "distributedtrainingjobs.torchrun.dev",
        "clusterdistributedtrainingruntimes.torchrun.dev",
        "distributedtrainingruntimes.torchrun.dev",
    }
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"} <= set(kinds)
    for obj in objs:
        if obj["kind"] not in (
            "Namespace",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
        ):
            assert obj["metadata"]["namespace"] == "torchrun-system", obj["kind"]
