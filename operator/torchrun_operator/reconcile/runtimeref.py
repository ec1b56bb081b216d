"""spec.runtimeRef resolved once: the job as the rest of the operator sees it (docs/runtimes.md).

When a job that names a runtime first starts, the shell reads the runtime (kube/runtimes.py)
and `resolve` records it in status.runtime: kind, name, uid, resourceVersion, a hash of the
merged spec, and the runtime's spec itself. That status is written before any pod is created
(the controller writes the status first). From then on the job's spec is merged onto the
recorded spec, never onto the runtime as it is now: editing or deleting the runtime changes
nothing in the job, its running pods or any later attempt. A spec the job changes itself
(while suspended, as Kueue does) is merged onto the same record.

The record is the runtime's spec, not the merged spec: the job's own fields stay the job's
(suspend, an elastic job's nodes), and what the reconciler renders is always the job's
current spec merged onto what was resolved.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..api import runtimemerge
from ..api.runtime import RuntimeSpec
from ..api.runtimemerge import recorded as _recorded
from ..api.runtimemerge import runtime_ref
from ..api.status_names import FINISHED

Obj = dict[str, Any]

# How often a job whose runtime does not exist yet looks again (nothing watches runtimes:
# the operator reads them by name, get only).
RUNTIME_RETRY_SECONDS = 10.0
# The most a runtime's spec may take in the job's status: ample for a pod template with
# sidecars and a page of env, and small next to the status budget (reconcile/budget.py).
MAX_RECORDED_BYTES = 64 * 1024
# Hex digits of status.runtime.specHash.
HASH_DIGITS = 16


@dataclass(frozen=True)
class Resolved:
    """The job as the operator works on it, and what became of its runtimeRef."""

    job: Obj
    """The job: with a resolved runtime, its spec merged onto the record and status.runtime
    set; else as it is."""
    own_spec: Obj | None = None
    """The job's own spec when a runtime was merged onto it (to say where a field came from)."""
    runtime: str | None = None
    """The runtime named, "<kind> <name>", for messages."""
    missing: bool = False
    """The runtime is not recorded and does not exist (yet): the job waits, Pending."""
    problem: str | None = None
    """Why the runtime cannot be used (too large to record, an invalid spec): InvalidSpec."""
    resolved_now: bool = False
    """This reconcile recorded the runtime."""


def needs_lookup(job: Obj) -> tuple[str, str] | None:
    """(kind, name) of the runtime the shell must read for this job: it names one, has not
    recorded it, and has not finished. None: nothing to read."""
    ref = runtime_ref(job)
    status = job.get("status") or {}
    if ref is None or _recorded(status) is not None or status.get("phase") in FINISHED:
        return None
    return ref


def spec_hash(spec: Obj) -> str:
    data = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()[:HASH_DIGITS]


def resolve(job: Obj, runtime: Obj | None) -> Resolved:
    """`job` as the operator works on it. `runtime`: the object the job's runtimeRef names as
    the shell read it (None: not found, or not read because needs_lookup said so)."""
    ref = runtime_ref(job)
    if ref is None:
        return Resolved(job)
    label = f"{ref[0]} {ref[1]}"
    own = job.get("spec") or {}
    status = job.get("status") or {}
    record = _recorded(status)
    resolved_now = False
    if record is None:
        if status.get("phase") in FINISHED:
            return Resolved(job, runtime=label)  # ended before it resolved one
        if runtime is None:
            return Resolved(job, runtime=label, missing=True)
        spec = runtime.get("spec") or {}
        try:
            RuntimeSpec.model_validate(spec)
        except ValidationError as err:
            return Resolved(job, runtime=label, problem=f"{label} is invalid: {err}")
        size = len(json.dumps(spec, separators=(",", ":")).encode())
        if size > MAX_RECORDED_BYTES:
            why = f"{label}'s spec takes {size} bytes, more than the {MAX_RECORDED_BYTES} a job "
            return Resolved(job, runtime=label, problem=why + "records of its runtime")
        meta = runtime.get("metadata") or {}
        record = {
            "kind": ref[0],
            "name": ref[1],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "specHash": spec_hash(runtimemerge.merge(spec, own)),
            "spec": spec,
        }
        record = {k: v for k, v in record.items() if v is not None}
        resolved_now = True
    merged = runtimemerge.merge(record["spec"], own)
    out = {**job, "spec": merged, "status": {**status, "runtime": record}}
    return Resolved(out, own_spec=own, runtime=label, resolved_now=resolved_now)
