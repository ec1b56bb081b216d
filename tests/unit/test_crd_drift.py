from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from torchrun_operator.api import names
from torchrun_operator.api.crd import CRD_FILES, crd, render_yaml, runtime_crd

CRDS = Path(__file__).resolve().parents[2] / "crds"
CRD_FILE = CRDS / "torchrun.dev_distributedtrainingjobs.yaml"


@pytest.mark.parametrize("kind", sorted(CRD_FILES))
def test_committed_crd_matches_generator(kind: str) -> None:
    assert (CRDS / CRD_FILES[kind]).read_text() == render_yaml(kind), (
        "crds/ drifted from api/: run `python -m torchrun_operator.api.crd --write crds`"
    )


def test_crds_folder_holds_exactly_the_generated_crds() -> None:
    assert sorted(p.name for p in CRDS.glob("*.yaml")) == sorted(CRD_FILES.values())


def _walk(node: object, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}/{i}")


def _assert_structural(schema: dict[str, Any]) -> None:
    for path, node in _walk(schema):
        assert (
            "$ref" not in node and "anyOf" not in node or node.get("x-kubernetes-int-or-string")
        ), path
        if "properties" in node:
            assert node.get("type") == "object", path
            assert "additionalProperties" not in node, path
        if "required" in node:
            assert node["required"], path  # OpenAPI: a required list has an entry


@pytest.mark.parametrize("kind", [names.CLUSTER_RUNTIME_KIND, names.RUNTIME_KIND])
def test_runtime_schemas_are_structural_and_scoped(kind: str) -> None:
    doc = runtime_crd(kind)
    _assert_structural(doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    scope = "Cluster" if kind == names.CLUSTER_RUNTIME_KIND else "Namespaced"
    assert doc["spec"]["scope"] == scope
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    trainer = spec["properties"]["template"]["properties"]["spec"]["properties"]["containers"]
    assert trainer["items"]["required"] == ["name"]  # image and command may be left to jobs
    # A runtime records what its author set: a default written in by the apiserver would be
    # a setting of every job (a rendezvous.port that host-network jobs would share).
    for field in ("rendezvous", "torchrun", "failurePolicy", "scheduling"):
        assert not [p for p, node in _walk(spec["properties"][field]) if "default" in node], field


def test_schema_is_structural() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    _assert_structural(schema)
    spec = schema["properties"]["spec"]
    # unknown fields are pruned/rejected everywhere but inside the pod template
    assert not spec.get("x-kubernetes-preserve-unknown-fields")
    assert spec["properties"]["template"]["x-kubernetes-preserve-unknown-fields"]
    assert spec["properties"]["nprocPerNode"] == {
        "description": spec["properties"]["nprocPerNode"]["description"],
        "x-kubernetes-int-or-string": True,
    }
    # A job with a runtime may leave image and command to it; the job's CEL rule asks for them
    # on a job without one (tests/integration/test_admission.py).
    container = spec["properties"]["template"]["properties"]["spec"]["properties"]["containers"]
    assert container["items"]["required"] == ["name"]
    # What a runtime may default has no CRD default: the apiserver would write it into every job
    # and it would override the runtime's.
    for field in ("rendezvous", "torchrun", "failurePolicy", "scheduling"):
        assert not [p for p, node in _walk(spec["properties"][field]) if "default" in node], field


def test_crd_has_status_printer_columns_and_short_names() -> None:
    doc = yaml.safe_load(render_yaml())
    version = doc["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase",
        "Ready",
        "Attempt",
        "Age",
    ]
    assert doc["spec"]["names"]["shortNames"] == ["dtj", "dtjs"]
    rules = version["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    assert any("metadata.name" in r["rule"] for r in rules)
