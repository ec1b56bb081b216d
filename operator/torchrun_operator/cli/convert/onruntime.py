"""kubectl dtj convert --runtime: a converted job that keeps only what differs from a training
runtime's spec (docs/runtimes.md). The inverse of api/runtimemerge.py's merge: merging
the reduced job onto the runtime gives what merging the whole job would have given
(tests/unit/cli/test_convert_runtime.py checks it as a property)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchrun_operator.api import names
from torchrun_operator.api.runtimemerge import KEYED, joinable

Obj = dict[str, Any]
_SAME = object()  # the job gives nothing the runtime does not


def only_what_differs(runtime: Mapping[str, Any], job: Mapping[str, Any]) -> Obj:
    """`job` (a spec) without what merging it onto `runtime` (a runtime's spec) would give
    anyway."""
    out = _reduce_obj(runtime, job)
    return out if isinstance(out, dict) else {}


def _reduce_obj(base: Mapping[str, Any], over: Mapping[str, Any]) -> Obj:
    out: Obj = {}
    for key, value in over.items():
        if value is None:
            continue
        if key not in base or base[key] is None:
            out[key] = value
            continue
        reduced = _reduce_field(key, base[key], value)
        if reduced is not _SAME:
            out[key] = reduced
    return out


def _reduce_field(key: str, base: Any, over: Any) -> Any:
    if isinstance(base, Mapping) and isinstance(over, Mapping):
        out = _reduce_obj(base, over)
        return out if out else _SAME
    if isinstance(base, list) and isinstance(over, list):
        if key in KEYED:
            return _reduce_keyed(base, over, *KEYED[key])
        if joinable(base, over):
            new = [v for v in over if v not in base]
            return new if new else _SAME
    return _SAME if base == over else over


def _reduce_keyed(base: list[Any], over: list[Any], key: str, how: str) -> Any:
    theirs = {v.get(key): v for v in base if isinstance(v, Mapping)}
    out = []
    for item in over:
        k = item.get(key) if isinstance(item, Mapping) else None
        if k is None or k not in theirs:
            out.append(item)
        elif how == "merge":
            reduced = _reduce_obj(theirs[k], item)
            if set(reduced) - {key}:
                out.append({key: k, **reduced})
        elif item != theirs[k]:
            out.append(item)
    return out if out else _SAME


def onto_runtime(job: Obj, runtime: Mapping[str, Any]) -> Obj:
    """The converted job naming `runtime` (the runtime object) and keeping only what differs.
    Its trainer takes the runtime's trainer's name: both are the first container."""
    spec = dict(job["spec"])
    rt_spec = runtime.get("spec") or {}
    rt_containers = ((rt_spec.get("template") or {}).get("spec") or {}).get("containers") or []
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    if rt_containers and containers:
        spec["template"] = {
            **spec["template"],
            "spec": {
                **spec["template"]["spec"],
                "containers": [
                    {**containers[0], "name": rt_containers[0]["name"]},
                    *containers[1:],
                ],
            },
        }
    reduced = only_what_differs(rt_spec, spec)
    ref: Obj = {"name": runtime["metadata"]["name"]}
    if runtime.get("kind") == names.RUNTIME_KIND:
        ref = {"kind": names.RUNTIME_KIND, **ref}
    return {**job, "spec": {"runtimeRef": ref, **reduced}}
