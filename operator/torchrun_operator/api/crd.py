"""Generate the DistributedTrainingJob CRD, and the training runtimes' CRDs, from the pydantic
models.

    python -m torchrun_operator.api.crd > crds/torchrun.dev_distributedtrainingjobs.yaml
    python -m torchrun_operator.api.crd --write crds   # all three CRDs

Pydantic's JSON schema is turned into a structural OpenAPI v3 schema: $refs inlined, nullable
branches dropped, `int | str` as `x-kubernetes-int-or-string`, defaults kept (nested objects
default to `{}` so their own field defaults apply), descriptions (the models' docstrings) on
one line per paragraph. The CEL rules that make the apiserver reject bad jobs at `kubectl
apply` come with the models (api/template.py, api/spec.py), next to the Python checks they
repeat, and from api/celrules.py (the CEL-only ones); only the rules on the object's metadata,
which no model describes, are here.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from pydantic import BaseModel

from . import names
from .runtime import RuntimeSpec
from .spec import JobSpec
from .status import JobStatus

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


def model_schema(model: type[BaseModel]) -> JsonDict:
    raw = model.model_json_schema(by_alias=True)
    return _structural(raw, raw.get("$defs", {}))


# What a runtime can default (api/runtime.py). The job's schema gives these no defaults: the
# apiserver would write them into every job, and a default the job never set would then
# override its runtime's. The model's defaults apply when the operator reads the spec.
RUNTIME_DEFAULTED = ("rendezvous", "torchrun", "failurePolicy", "scheduling")


def _without_defaults(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("default", None)
        for value in node.values():
            _without_defaults(value)
    elif isinstance(node, list):
        for value in node:
            _without_defaults(value)


def job_spec_schema() -> JsonDict:
    """JobSpec's schema, open for a job with a runtime: template, its spec and containers, and
    each container's image and command may be left to the runtime. JobSpec's rule
    _TEMPLATE_UNLESS_RUNTIME asks for them back on a job without runtimeRef."""
    spec = model_schema(JobSpec)
    template = spec["properties"]["template"]
    pod = template["properties"]["spec"]
    for node, optional in ((spec, "template"), (template, "spec"), (pod, "containers")):
        node["required"] = [r for r in node["required"] if r != optional]
        if not node["required"]:
            del node["required"]  # OpenAPI wants a required list to have an entry
    pod["properties"]["containers"]["items"]["required"] = ["name"]
    for field in RUNTIME_DEFAULTED:
        _without_defaults(spec["properties"][field])
    return spec


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
            "spec": job_spec_schema(),
            "status": model_schema(JobStatus),
        },
        "x-kubernetes-validations": ROOT_RULES,
    }


def _crd_object(
    kind: str, plural: str, singular: str, short_names: list[str], scope: str, version: JsonDict
) -> JsonDict:
    """A CRD of this API group with one served and stored version; `version` gives the rest of
    that version (subresources, printer columns, schema), in the order it is written."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{names.GROUP}"},
        "spec": {
            "group": names.GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short_names,
            },
            "versions": [{"name": names.VERSION, "served": True, "storage": True, **version}],
        },
    }


def crd() -> JsonDict:
    return _crd_object(
        names.KIND,
        names.PLURAL,
        names.SINGULAR,
        list(names.SHORT_NAMES),
        "Namespaced",
        {
            "subresources": {"status": {}},
            "additionalPrinterColumns": PRINTER_COLUMNS,
            "schema": {"openAPIV3Schema": openapi_schema()},
        },
    )


_RUNTIME_OBJECT = (
    "A training runtime: the pod template and defaults that DistributedTrainingJobs naming it "
    "in spec.runtimeRef start from; each job gives only what differs (docs/runtimes.md)."
)


def runtime_crd(kind: str) -> JsonDict:
    """The CRD of ClusterDistributedTrainingRuntime (cluster-scoped) or
    DistributedTrainingRuntime (namespaced): the same spec, no status."""
    cluster = kind == names.CLUSTER_RUNTIME_KIND
    plural = names.CLUSTER_RUNTIME_PLURAL if cluster else names.RUNTIME_PLURAL
    where = "cluster-wide" if cluster else "in its namespace"
    spec = model_schema(RuntimeSpec)
    # No CRD defaults here either: a runtime records what its author set, and nothing else
    # (a defaulted rendezvous.port would be an explicit port to every job, render/ports.py).
    for field in RUNTIME_DEFAULTED:
        _without_defaults(spec["properties"][field])
    schema = {
        "type": "object",
        "description": f"{_RUNTIME_OBJECT} This one is {where}.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": _API_VERSION},
            "kind": {"type": "string", "description": f"Kind is the REST resource: {kind}."},
            "metadata": {"type": "object"},
            "spec": spec,
        },
    }
    return _crd_object(
        kind,
        plural,
        kind.lower(),
        ["cdtr"] if cluster else ["dtr"],
        "Cluster" if cluster else "Namespaced",
        {
            "additionalPrinterColumns": [
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
            ],
            "schema": {"openAPIV3Schema": schema},
        },
    )


_HEADER = "# Generated by `python -m torchrun_operator.api.crd`; do not edit.\n"


def render_yaml(kind: str = names.KIND) -> str:
    doc = crd() if kind == names.KIND else runtime_crd(kind)
    return _HEADER + yaml.safe_dump(doc, sort_keys=False, width=100)


# Each CRD's file in crds/ (the chart and deploy/install.yaml copy them).
CRD_FILES = {
    names.KIND: f"{names.GROUP}_{names.PLURAL}.yaml",
    names.CLUSTER_RUNTIME_KIND: f"{names.GROUP}_{names.CLUSTER_RUNTIME_PLURAL}.yaml",
    names.RUNTIME_KIND: f"{names.GROUP}_{names.RUNTIME_PLURAL}.yaml",
}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        for kind, file in CRD_FILES.items():
            with open(f"{sys.argv[2]}/{file}", "w") as out:
                out.write(render_yaml(kind))
        return
    sys.stdout.write(render_yaml())


if __name__ == "__main__":
    main()
