"""A job's spec merged onto its training runtime's spec: one pure function, and where each
field of the result came from, to explain an invalid result (docs/runtimes.md).

The rules, which tests/unit/reconcile/test_runtimemerge.py checks as properties:
- objects merge field by field, recursively; what the job sets wins (scalars, resources one
  resource name at a time, labels, node selectors, security contexts ...);
- containers (and init and ephemeral containers) merge by name, recursively; the runtime's
  come first, in its order (its first, the trainer, stays first), then the job's new ones;
- env entries merge by name, volumes by name, volume mounts by mountPath: the job's entry
  replaces the runtime's of the same key whole (an env var's value and valueFrom, a volume's
  source, cannot be mixed);
- other lists of objects (tolerations, envFrom, ports, imagePullSecrets ...) are joined: the
  runtime's, then the job's that are not among them;
- lists of strings or numbers (command, args, capabilities, retryableExitCodes) are values:
  the job's replaces the runtime's;
- a null or absent field in the job is not given: a job can remove nothing, only add or
  replace what it names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ValidationError

from .names import CLUSTER_RUNTIME_KIND

Obj = dict[str, Any]


def runtime_ref(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the runtime the job object names, None if none (or malformed: the
    model says so then)."""
    spec = job.get("spec")
    ref = spec.get("runtimeRef") if isinstance(spec, Mapping) else None
    if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str):
        return None
    return str(ref.get("kind") or CLUSTER_RUNTIME_KIND), ref["name"]


def recorded(status: Mapping[str, Any]) -> Obj | None:
    """status.runtime, the runtime the operator resolved for the job, if it holds a spec."""
    rec = status.get("runtime")
    return rec if isinstance(rec, dict) and isinstance(rec.get("spec"), dict) else None


# Lists whose entries are matched by a key, and whether a match is merged (containers) or the
# job's entry replaces the runtime's whole.
KEYED: dict[str, tuple[str, Literal["merge", "replace"]]] = {
    "containers": ("name", "merge"),
    "initContainers": ("name", "merge"),
    "ephemeralContainers": ("name", "merge"),
    "env": ("name", "replace"),
    "volumes": ("name", "replace"),
    "volumeMounts": ("mountPath", "replace"),
}


def merge(runtime: Mapping[str, Any], job: Mapping[str, Any]) -> Obj:
    """The job's spec merged onto the runtime's spec (both as on the wire, camelCase). The
    result is a new document; neither input is changed."""
    out = _merge_obj(runtime, job)
    assert isinstance(out, dict)
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _merge_obj(base: Mapping[str, Any], over: Mapping[str, Any]) -> Obj:
    out: Obj = {k: _copy(v) for k, v in base.items() if v is not None}
    for key, value in over.items():
        if value is None:
            continue
        out[key] = _merge_field(key, out[key], value) if key in out else _copy(value)
    return out


def _merge_field(key: str, base: Any, over: Any) -> Any:
    if isinstance(base, Mapping) and isinstance(over, Mapping):
        return _merge_obj(base, over)
    if isinstance(base, list) and isinstance(over, list):
        if key in KEYED:
            return _merge_keyed(base, over, *KEYED[key])
        if joinable(base, over):
            return [*base, *(_copy(v) for v in over if v not in base)]
    return _copy(over)  # a scalar, a list of scalars, or a type the job changed


def joinable(base: list[Any], over: list[Any]) -> bool:
    """Lists of objects without a key are joined; lists of scalars are values."""
    return all(isinstance(v, Mapping) for v in (*base, *over))


def _merge_keyed(
    base: list[Any], over: list[Any], key: str, how: Literal["merge", "replace"]
) -> list[Any]:
    out = list(base)
    where = {v.get(key): i for i, v in enumerate(out) if isinstance(v, Mapping)}
    for item in over:
        if item is None:
            continue
        k = item.get(key) if isinstance(item, Mapping) else None
        if k is None or k not in where:
            out.append(_copy(item))
            if k is not None:
                where[k] = len(out) - 1
        elif how == "merge":
            out[where[k]] = _merge_obj(out[where[k]], item)
        else:
            out[where[k]] = _copy(item)
    return out


# ---- where a field of the merged spec came from -------------------------------------------

Origin = Literal["job", "runtime", "job and runtime"]


def origin(loc: tuple[int | str, ...], merged: Any, job: Any) -> Origin:
    """Where the value at `loc` (a path in the merged spec, as pydantic reports it) came
    from: the job, the runtime, or both (an object the job changed part of)."""
    m, j = merged, job
    for part in loc:
        if isinstance(part, int) and isinstance(m, list) and 0 <= part < len(m):
            item = m[part]
            m, j = item, _counterpart(item, j) if isinstance(j, list) else None
        elif isinstance(part, str) and isinstance(m, Mapping) and part in m:
            m, j = m[part], j.get(part) if isinstance(j, Mapping) else None
        else:
            break  # a part pydantic adds (a union's branch): the value ends here
        if j is None:
            return "runtime"
    return "job" if j == m else "job and runtime"


def _counterpart(item: Any, job_list: list[Any]) -> Any:
    """The job's entry a merged list entry came from, if any: the same key or equal."""
    if isinstance(item, Mapping):
        for key in ("name", "mountPath"):
            if key in item:
                return next(
                    (v for v in job_list if isinstance(v, Mapping) and v.get(key) == item[key]),
                    None,
                )
    return next((v for v in job_list if v == item), None)


# Errors named in one InvalidSpec message; the rest are counted.
MAX_ERRORS = 3


def explain(err: ValidationError, merged: Obj, job: Obj, runtime: str) -> str:
    """The model's refusal of a merged spec, each field named with where it came from, e.g.
    `spec.template.spec.containers[0].image (from the runtime ClusterDistributedTrainingRuntime
    torch-gpu): Field required`."""
    whence = {"job": "the job", "runtime": f"the runtime {runtime}", "job and runtime": ""}
    parts = []
    errors = err.errors(include_url=False)
    for e in errors[:MAX_ERRORS]:
        loc = tuple(e["loc"])
        src = origin(loc, merged, job)
        where = whence[src] or f"the job merged onto the runtime {runtime}"
        parts.append(f"{_path(loc)} (from {where}): {e['msg']}")
    more = len(errors) - MAX_ERRORS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _path(loc: tuple[int | str, ...]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out
