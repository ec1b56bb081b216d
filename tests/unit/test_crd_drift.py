from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from torchrun_operator.api.crd import crd, render_yaml

CRD_FILE = (
    Path(__file__).resolve().parents[2] / "crds" / "torchrun.dev_distributedtrainingjobs.yaml"
)


def test_committed_crd_matches_generator() -> None:
    assert CRD_FILE.read_text() == render_yaml(), (
        "crds/ drifted from api/: run "
        "`python -m torchrun_operator.api.crd > crds/torchrun.dev_distributedtrainingjobs.yaml`"
    )


def _walk(node: object, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}/{i}")


def test_schema_is_structural() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert (
            "$ref" not in node and "anyOf" not in node or node.get("x-kubernetes-int-or-string")
        ), path
        if "properties" in node:
            assert node.get("type") == "object", path
            assert "additionalProperties" not in node, path
    spec = schema["properties"]["spec"]
    # unknown fields are pruned/rejected everywhere but inside the pod template
    assert not spec.get("x-kubernetes-preserve-unknown-fields")
    assert spec["properties"]["template"]["x-kubernetes-preserve-unknown-fields"]
    assert spec["properties"]["nprocPerNode"] == {
        "description": spec["properties"]["nprocPerNode"]["description"],
        "x-kubernetes-int-or-string": True,
    }
    container = spec["properties"]["template"]["properties"]["spec"]["properties"]["containers"]
    assert set(container["items"]["required"]) >= {"image", "command"}


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
