"""The generated CRD: every field described, every model's CEL rules in it."""

from collections.abc import Iterator
from typing import Any

import pytest
from torchrun_operator.api import models
from torchrun_operator.api.crd import crd
from torchrun_operator.api.models import JobSpec, gpu_count, trainer_gpu_limit

Schema = dict[str, Any]


def _root() -> Schema:
    schema: Schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _fields(node: Schema, path: str) -> Iterator[tuple[str, Schema]]:
    """Every declared property below `node`, with its path. What a preserve-unknown-fields
    object passes through is not declared, so it is not walked (nor described)."""
    for name, child in (node.get("properties") or {}).items():
        yield f"{path}.{name}", child
        yield from _fields(child, f"{path}.{name}")
    if "items" in node:
        yield from _fields(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _fields(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("top", ["spec", "status"])
def test_every_field_has_a_description(top: str) -> None:
    """So `kubectl explain distributedtrainingjob.<top> --recursive` describes every field."""
    node = _root()["properties"][top]
    assert node.get("description")
    missing = [p for p, child in _fields(node, top) if not child.get("description", "").strip()]
    assert not missing, f"fields without a description: {missing}"


def test_descriptions_are_one_line_per_paragraph() -> None:
    for path, child in _fields(_root(), ""):
        text = child.get("description", "")
        assert "\n" not in text.replace("\n\n", ""), path
        assert "  " not in text, path


def _rules(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations") or []:
            assert rule.get("message"), rule
            yield rule["rule"]
        for value in node.values():
            yield from _rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from _rules(value)


def test_every_models_rules_are_in_the_crd() -> None:
    in_crd = list(_rules(_root()))
    by_model = {
        "JobSpec": JobSpec.RULES,
        "Resources": models.Resources.RULES,
        "Volume": models.Volume.RULES,
        "PodSpec": models.PodSpec.RULES,
    }
    for model, rules in by_model.items():
        assert rules, model
        for rule in rules:
            assert rule.rule in in_crd, (model, rule.message)


def test_transition_rules_sit_on_the_spec() -> None:
    spec_rules = [r["rule"] for r in _root()["properties"]["spec"]["x-kubernetes-validations"]]
    transitions = [r for r in spec_rules if "oldSelf" in r]
    assert len(transitions) == 7  # nodes, elastic, nprocPerNode, template, rendezvous,
    # scheduling, runtimeRef
    elsewhere = [r for r in _rules(_root()) if "oldSelf" in r and r not in transitions]
    assert not elsewhere


@pytest.mark.parametrize(
    ("quantity", "count"),
    [
        (8, 8),
        ("8", 8),
        (0, 0),
        ("0", 0),
        (64, 64),
        ("64", 64),
        (65, None),
        ("65", None),
        (-1, None),
        ("-1", None),
        ("500m", None),
        ("0.5", None),
        ("1e3", None),
        ("08", None),
        (" 8", None),
        ("8Gi", None),
        ("", None),
        (True, None),
    ],
)
def test_gpu_count(quantity: Any, count: int | None) -> None:
    assert gpu_count(quantity) == count


def _spec(resources: dict[str, Any], **over: Any) -> JobSpec:
    container = {"name": "t", "image": "i", "command": ["python"], "resources": resources}
    return JobSpec.model_validate(
        {"nodes": 1, "template": {"spec": {"containers": [container]}}, **over}
    )


def test_trainer_gpu_limit_reads_the_limit() -> None:
    assert trainer_gpu_limit(_spec({"limits": {"nvidia.com/gpu": "4"}})) == 4
    assert trainer_gpu_limit(_spec({"limits": {"nvidia.com/gpu": 4}, "requests": {}})) == 4
    assert trainer_gpu_limit(_spec({"limits": {"cpu": "500m"}})) is None
    assert trainer_gpu_limit(_spec({})) is None


def test_equal_gpu_request_and_limit_in_any_spelling() -> None:
    spellings: list[tuple[int | str, int | str]] = [(8, "8"), ("8", 8), (0, "0")]
    for limit, request in spellings:
        resources = {"limits": {"nvidia.com/gpu": limit}, "requests": {"nvidia.com/gpu": request}}
        assert trainer_gpu_limit(_spec(resources)) == int(limit)


@pytest.mark.parametrize(
    "path",
    ["/dev/shm", "/var/run/torchrun-data", "/opt/torchrun-operator2", "/var/run", "/data"],
)
def test_mounts_next_to_the_reserved_paths_are_accepted(path: str) -> None:
    JobSpec.model_validate(
        {
            "nodes": 1,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "t",
                            "image": "i",
                            "command": ["python"],
                            "volumeMounts": [{"name": "v", "mountPath": path}],
                        }
                    ]
                }
            },
        }
    )


def test_only_the_trainers_mounts_are_checked() -> None:
    sidecar = {
        "name": "s",
        "image": "i",
        "command": ["sh"],
        "volumeMounts": [{"name": "v", "mountPath": "/var/run/torchrun"}],
    }
    trainer = {"name": "t", "image": "i", "command": ["python"]}
    JobSpec.model_validate({"nodes": 1, "template": {"spec": {"containers": [trainer, sidecar]}}})
