"""Generate the DistributedTrainingJob CRD from the pydantic models.

    python -m torchrun_operator.api.crd > crds/torchrun.dev_distributedtrainingjobs.yaml

Pydantic's JSON schema is turned into a structural OpenAPI v3 schema: $refs inlined, nullable
branches dropped, `int | str` as `x-kubernetes-int-or-string`, defaults kept (nested objects
default to `{}` so their own field defaults apply), descriptions (the models' docstrings) on
one line per paragraph. The CEL rules that make the apiserver reject bad jobs at `kubectl
apply` come with the models (api/models.py), next to the Python checks they repeat; only the
rules on the object's metadata, which no model describes, are here.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from . import names
from .models import JobSpec, JobStatus

JsonDict = dict[str, Any]

ROOT_RULES: list[JsonDict] = [
    {
        "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "message": "metadata.name must be a DNS-1035 label: lowercase letters, digits and '-', "
        "starting with a letter (it names the Service and the pods' hostnames)",
        "fieldPath": ".metadata.name",
    },
    {
        "rule": "size(self.metadata.name) + 1 + size(string((has(self.spec.elastic) && "
        "has(self.spec.elastic.maxNodes) ? self.spec.elastic.maxNodes : self.spec.nodes) - 1))"
        " <= 63",
        "message": "metadata.name is too long: '<name>-<highest node index>' is a pod hostname "
        "and must fit in 63 characters",
        "fieldPath": ".metadata.name",
    },
]

PRINTER_COLUMNS: list[JsonDict] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": ".status.nodes.summary",
        "description": "Ready pods / desired pods",
    },
    {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP = {"title", "additionalProperties", "$defs"}

# The standard fields, described as for every Kubernetes object.
_API_VERSION = (
    "APIVersion defines the versioned schema of this representation of an object: "
    f"{names.API_VERSION}."
)
_KIND = f"Kind is the REST resource this object represents: {names.KIND}."
_OBJECT = (
    "A distributed PyTorch training job: one pod per node runs torchrun against a c10d "
    "rendezvous, and the status tells which pod holds which ranks and why it failed."
)


def _one_line(text: str) -> str:
    """A docstring as the CRD's description: paragraphs kept, line breaks within them not."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def _is_null(node: JsonDict) -> bool:
    return node.get("type") == "null"


def _structural(node: JsonDict, defs: JsonDict) -> JsonDict:
    """Convert one pydantic JSON-schema node into a structural schema node."""
    node = dict(node)
    if isinstance(node.get("description"), str):
        node["description"] = _one_line(node["description"])
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        merged = {**target, **node}
        if isinstance(node.get("default"), dict):
            merged["default"] = {}
        return _structural(merged, defs)
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if not _is_null(b)]
        if node.get("default", 0) is None:
            node.pop("default")
        if len(branches) == 1:
            return _structural({**branches[0], **node}, defs)
        kinds = {b.get("type", "string" if "const" in b else None) for b in branches}
        if kinds == {"integer", "string"}:
            int_or_string = {k: v for k, v in node.items() if k not in _DROP}
            int_or_string["x-kubernetes-int-or-string"] = True
            return int_or_string
        raise ValueError(f"cannot express anyOf {branches} structurally")
    out: JsonDict = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "const":
            out["type"] = "string"
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key == "items":
            out[key] = _structural(value, defs)
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = _structural(extra, defs)
    elif extra is True and "properties" not in node:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def model_schema(model: type[JobSpec] | type[JobStatus]) -> JsonDict:
    raw = model.model_json_schema(by_alias=True)
    return _structural(raw, raw.get("$defs", {}))


def openapi_schema() -> JsonDict:
    return {
        "type": "object",
        "description": _OBJECT,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": _API_VERSION},
            "kind": {"type": "string", "description": _KIND},
            # The apiserver allows nothing but name restrictions here (no descriptions):
            # `kubectl explain` shows the standard ObjectMeta.
            "metadata": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 63}},
            },
            "spec": model_schema(JobSpec),
            "status": model_schema(JobStatus),
        },
        "x-kubernetes-validations": ROOT_RULES,
    }


def crd() -> JsonDict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{names.PLURAL}.{names.GROUP}"},
        "spec": {
            "group": names.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": names.KIND,
                "listKind": f"{names.KIND}List",
                "plural": names.PLURAL,
                "singular": names.SINGULAR,
                "shortNames": list(names.SHORT_NAMES),
            },
            "versions": [
                {
                    "name": names.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def render_yaml() -> str:
    header = "# Generated by `python -m torchrun_operator.api.crd`; do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)


def main() -> None:
    sys.stdout.write(render_yaml())


if __name__ == "__main__":
    main()
