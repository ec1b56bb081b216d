"""A DistributedTrainingJob as the SDK hands it out, and the object it submits. Pure: no I/O.

The spec and the status are the API's own pydantic models (api/models.py), so a job read back
is typed as the operator writes it; `raw` keeps the object as the apiserver returned it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..api import runtimemerge
from ..api.models import JobSpec, JobStatus, RankStatus
from ..api.names import API_VERSION, KIND
from ..api.ranks import parse_ranks
from ..api.status_names import FINISHED, Phase
from .errors import RankNotFound

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Job:
    """One DistributedTrainingJob: its identity, its spec, its status."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    spec: JobSpec
    status: JobStatus
    raw: Mapping[str, Any]

    @classmethod
    def from_object(cls, obj: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> Job:
        """The job as the apiserver returned it. A job that names a runtime has as `spec` its
        spec merged onto the runtime's, as the operator runs it: onto what status.runtime
        recorded once the operator resolved it, else onto `runtime` (the runtime object as
        the client read it); fields left to a runtime neither gives read as UNRESOLVED."""
        meta = obj.get("metadata") or {}
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            spec=_spec(obj, runtime),
            status=lenient(JobStatus, obj.get("status") or {}),
            raw=obj,
        )

    @property
    def phase(self) -> Phase:
        return Phase(self.status.phase or Phase.PENDING)

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED


# What a job that names a runtime shows for the trainer's image or command while the operator
# has not resolved its runtime yet and the client could not read it.
UNRESOLVED = "<from the runtime>"


def _spec(obj: Mapping[str, Any], runtime: Mapping[str, Any] | None) -> JobSpec:
    spec = obj.get("spec") or {}
    if runtime_of(obj) is None:
        return lenient(JobSpec, spec)
    status = obj.get("status")
    recorded = runtimemerge.recorded(status) if isinstance(status, Mapping) else None
    base = next(
        (
            r["spec"]
            for r in (recorded, runtime)
            if isinstance(r, Mapping) and isinstance(r.get("spec"), Mapping)
        ),
        None,
    )
    merged = runtimemerge.merge(base, spec) if base is not None else copy.deepcopy(dict(spec))
    template = merged.setdefault("template", {})
    pod = template.setdefault("spec", {}) if isinstance(template, dict) else {}
    containers = (
        pod.setdefault("containers", [{"name": "trainer"}]) if isinstance(pod, dict) else []
    )
    for c in containers if isinstance(containers, list) else []:
        if isinstance(c, dict):
            c.setdefault("image", UNRESOLVED)
            c.setdefault("command", [UNRESOLVED])
    return lenient(JobSpec, merged)


def lenient(model: type[M], data: Mapping[str, Any]) -> M:
    """`data` as `model`, leaving out fields this version of the models does not know: an
    operator newer than the SDK may write more (the models refuse unknown fields, as the
    reconciler must)."""
    doc: Any = copy.deepcopy(dict(data))
    for _ in range(64):  # each round drops every unknown field pydantic reported
        try:
            return model.model_validate(doc)
        except ValidationError as e:
            unknown = [err["loc"] for err in e.errors() if err["type"] == "extra_forbidden"]
            if not unknown:
                raise
            for loc in unknown:
                _drop(doc, loc)
    return model.model_validate(doc)


def _drop(doc: Any, loc: tuple[int | str, ...]) -> None:
    *parents, leaf = loc
    node = doc
    for key in parents:
        node = node[key]
    del node[leaf]


def runtime_of(job: JobSpec | Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the training runtime the job's spec names, None without one."""
    if isinstance(job, JobSpec):
        ref = job.runtime_ref
        return (ref.kind, ref.name) if ref else None
    return runtimemerge.runtime_ref(job)


def job_object(
    job: JobSpec | Mapping[str, Any],
    name: str | None,
    namespace: str,
    runtime: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The object to create: a JobSpec (named by `name`), or a whole object as a dict (its
    metadata.name, unless `name` is given). The spec is validated here, so a bad job fails
    before it reaches the apiserver, with the same message the apiserver would give. A spec
    that names a runtime may leave the image, the command and more to it: it is validated
    merged onto `runtime` (the runtime object, as the operator will merge it; ValueError naming
    each field and where it came from), or, when the runtime could not be read, left to the
    apiserver's schema and to the operator, which fails the job naming the field."""
    if isinstance(job, JobSpec):
        obj: dict[str, Any] = {"metadata": {}, "spec": spec_dict(job)}
    else:
        obj = {k: v for k, v in job.items()}
        obj["metadata"] = dict(obj.get("metadata") or {})
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            raise ValueError("the job has no spec")
        ref = runtime_of(job)
        if ref is None:
            JobSpec.model_validate(spec)
        elif isinstance(runtime, Mapping) and isinstance(runtime.get("spec"), Mapping):
            merged = runtimemerge.merge(runtime["spec"], spec)
            try:
                JobSpec.model_validate(merged)
            except ValidationError as e:
                where = f"{ref[0]} {ref[1]}"
                raise ValueError(runtimemerge.explain(e, merged, dict(spec), where)) from None
    obj.setdefault("apiVersion", API_VERSION)
    obj.setdefault("kind", KIND)
    if obj["apiVersion"] != API_VERSION or obj["kind"] != KIND:
        raise ValueError(f"not a {KIND} of {API_VERSION}: {obj['apiVersion']}/{obj['kind']}")
    if name:
        obj["metadata"]["name"] = name
    if not obj["metadata"].get("name") and not obj["metadata"].get("generateName"):
        raise ValueError("the job needs a name (metadata.name, or name=...)")
    obj["metadata"]["namespace"] = namespace
    return obj


def spec_dict(spec: JobSpec) -> dict[str, Any]:
    """The spec as the API takes it: camelCase, only the fields that were set (the CRD's
    defaults fill the rest, as for a job written in YAML)."""
    out: dict[str, Any] = spec.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return out


def rank_holder(job: Job, rank: int) -> RankStatus:
    """The status.ranks entry of the pod holding global `rank`; RankNotFound saying what is
    known (no pods yet, rendezvous not done, a rank beyond the world size)."""
    entries = job.status.ranks or []
    for entry in entries:
        if entry.global_ranks and rank in parse_ranks(entry.global_ranks):
            return entry
    if not any(e.global_ranks for e in entries):
        raise RankNotFound(
            f"job {job.name}: global ranks are not assigned yet (rendezvous has not completed)"
        )
    world = job.status.world_size
    raise RankNotFound(f"job {job.name} has no global rank {rank} (world size {world or '-'})")


def root_cause(job: Job) -> str:
    """One paragraph on why the job failed, from status.failure (else its Failed condition)."""
    f = job.status.failure
    if f is None:
        cond = next((c for c in job.status.conditions or [] if c.type == "Failed"), None)
        why = (cond.message or cond.reason) if cond else None
        return f"job {job.name} failed" + (f": {why}" if why else "")
    where = [
        f"{label} {value}"
        for label, value in (
            ("rank", f.rank),
            ("pod", f.pod),
            ("node", f.node),
            ("exit code", f.exit_code),
            ("step", f.step),
        )
        if value is not None
    ]
    head = f"job {job.name} failed" + (f" ({f.reason})" if f.reason else "")
    head += f" at {', '.join(where)}" if where else ""
    return head + (f": {f.message}" if f.message else "")
