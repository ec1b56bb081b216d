"""The one builder of DistributedTrainingJob documents, for unit and integration tests alike
(pytest puts tests/ on sys.path): `job` for the job, `scripted` for a job that runs scripts
from a ConfigMap, `mount` to give the trainer a volume. Each test states only what matters to
it; everything else is the smallest valid job."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from torchrun_operator.api import names

Obj = dict[str, Any]

TRAINER = "trainer"
# Where `scripted` mounts its ConfigMap in the trainer.
WORKSPACE = "/workspace"


def document(
    name: str, spec: Obj | None = None, *, status: Obj | None = None, **metadata: Any
) -> Obj:
    """A DistributedTrainingJob named `name` with this spec (left out when None), status and
    further metadata (namespace, uid, generation, ...)."""
    doc: Obj = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name, **metadata},
    }
    if spec is not None:
        doc["spec"] = spec
    if status is not None:
        doc["status"] = status
    return doc


def job(
    name: str = "job",
    *,
    nodes: int = 2,
    nproc: int | str | None = None,
    image: str = "img",
    command: Sequence[str] = ("python", "train.py"),
    trainer: Mapping[str, Any] | None = None,
    pod: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    status: Obj | None = None,
    **spec: Any,
) -> Obj:
    """A job of `nodes` pods whose trainer runs `command` in `image`.

    `nproc`: spec.nprocPerNode (left out when None: the API's default); `trainer`: more fields
    of the trainer container (they replace the defaults, `name` included); `pod`: more fields
    of the pod template's spec; `metadata`: more metadata; `spec`: more fields of spec, spelled
    as the API spells them, replacing the defaults (copied: the caller's dicts stay its own).
    """
    container: Obj = {"name": TRAINER, "image": image, "command": list(command)}
    container.update(copy.deepcopy(dict(trainer or {})))
    body: Obj = {"nodes": nodes}
    if nproc is not None:
        body["nprocPerNode"] = nproc
    body["template"] = {"spec": {**copy.deepcopy(dict(pod or {})), "containers": [container]}}
    body.update(copy.deepcopy(spec))
    return document(name, body, status=status, **dict(metadata or {}))


def trainer_of(doc: Obj) -> Obj:
    return doc["spec"]["template"]["spec"]["containers"][0]


def mount(doc: Obj, volume: Obj, path: str) -> Obj:
    """`doc` with `volume` added to its pods and mounted in the trainer at `path`."""
    doc["spec"]["template"]["spec"].setdefault("volumes", []).append(volume)
    mounts = trainer_of(doc).setdefault("volumeMounts", [])
    mounts.append({"name": volume["name"], "mountPath": path})
    return doc


def configmap(name: str, data: Mapping[str, str]) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": dict(data)}


def scripted(name: str, scripts: Mapping[str, str], command: Sequence[str], **kw: Any) -> list[Obj]:
    """A ConfigMap `<name>-script` holding `scripts` (file name -> text) and a job (see `job`)
    running `command` with them mounted at /workspace."""
    doc = job(name, command=command, **kw)
    volume = {"name": "script", "configMap": {"name": f"{name}-script"}}
    return [configmap(f"{name}-script", scripts), mount(doc, volume, WORKSPACE)]


def condition(obj: Mapping[str, Any], type_: str) -> Any:
    """The condition of that type (a dict), or None: `obj` is a job, a status, or any object
    with status.conditions (a Kueue Workload)."""
    status = obj if "conditions" in obj else (obj.get("status") or {})
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def runtime(
    name: str,
    *,
    namespace: str | None = None,
    trainer: Mapping[str, Any] | None = None,
    pod: Mapping[str, Any] | None = None,
    **spec: Any,
) -> Obj:
    """A training runtime (docs/runtimes.md): a ClusterDistributedTrainingRuntime, or with a
    `namespace` a DistributedTrainingRuntime there. `trainer`: fields of its trainer container
    (name "trainer"); `pod`: more fields of its pod template's spec; `spec`: more fields of
    its spec (nprocPerNode, torchrun, rendezvous, failurePolicy, scheduling)."""
    container: Obj = {"name": TRAINER, **copy.deepcopy(dict(trainer or {}))}
    body: Obj = {
        "template": {"spec": {**copy.deepcopy(dict(pod or {})), "containers": [container]}}
    }
    body.update(copy.deepcopy(spec))
    kind = names.RUNTIME_KIND if namespace else names.CLUSTER_RUNTIME_KIND
    metadata: Obj = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": names.API_VERSION, "kind": kind, "metadata": metadata, "spec": body}


def on_runtime(
    name: str,
    runtime_name: str,
    *,
    kind: str = names.CLUSTER_RUNTIME_KIND,
    nodes: int = 2,
    trainer: Mapping[str, Any] | None = None,
    pod: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    status: Obj | None = None,
    **spec: Any,
) -> Obj:
    """A job of `nodes` pods on the runtime `runtime_name`, giving only `trainer` (fields of its
    container "trainer", left out when None), `pod` and `spec` of its own."""
    body: Obj = {"nodes": nodes, "runtimeRef": {"kind": kind, "name": runtime_name}}
    if trainer is not None or pod is not None:
        containers = [{"name": TRAINER, **copy.deepcopy(dict(trainer))}] if trainer else []
        podspec: Obj = copy.deepcopy(dict(pod or {}))
        if containers:
            podspec["containers"] = containers
        body["template"] = {"spec": podspec}
    body.update(copy.deepcopy(spec))
    return document(name, body, status=status, **dict(metadata or {}))
