"""reconcile(job, pods, now) -> Plan: the operator's decisions as one pure function.

Level-triggered: everything is derived from the job (spec and the status we wrote last
time, which is the operator's only memory), the pods observed now, and what their launchers'
status endpoints said when last read (`live`: the rank map and progress of running pods).
Calling it again with the same inputs plans the same creates and deletes (which the shell
treats as idempotent), and no events or transitions: those come only where the status changes.

This module is the top-level step: it reads the job (its status migrated, its spec
validated, the live reads bound to their pods) and says which concern acts: nospec.py
(an invalid spec, a runtime not found), runpolicy.py (suspend, resume, the deadline),
queueing.py (Kueue), running.py (starting and observing the current attempt), finish.py
(after the end). What happens when pods fail or hang is decided by the policies in
reconcile/failure/.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..api import names
from ..api.models import JobSpec
from ..api.runtimemerge import explain
from ..api.status_names import FINISHED, ConditionType, Phase, Reason
from ..render import world_size
from . import attempts, gang, nospec, overdue
from . import conditions as cond
from .admission import Admission
from .context import MAX_REQUEUE_SECONDS, Ctx, renamed
from .failure import SETTLE_SECONDS
from .failure.avoid import prune as avoid_prune
from .finish import after_finish
from .nospec import bare_ctx
from .observe import Live, PodView, confined, parse_live, truncate, view
from .plan import Plan
from .podinput import Rejected
from .queueing import admitted, queue, record_admission
from .refused import say_refused
from .running import observe, start_attempt
from .runpolicy import deadline_passed, resume, suspend
from .runtimeref import Resolved

# The reconciler's timing constants are read from here (tests/unit/reconcile).
__all__ = ["MAX_REQUEUE_SECONDS", "SETTLE_SECONDS", "reconcile"]


def reconcile(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    now: datetime,
    blocked: Sequence[str] = (),
    refused: Sequence[str] = (),
    live: Mapping[str, Any] | None = None,
    admission: Admission | None = None,
    view_of: Callable[[dict[str, Any], str | None], PodView] = view,
    runtime: Resolved | None = None,
) -> Plan:
    """`blocked`: objects the shell found in the job's way (a Service or ConfigMap under the
    job's names that is not the job's), described for people; while any is, no pod is
    created and the Blocked condition says why. `refused`: the apiserver's answers to pod
    creates it refused (Pod Security, a quota, a webhook), which the shell retries with
    back-off; the Blocked condition carries them meanwhile. `live`: per pod uid, the latest
    answer of the pod's launcher status endpoint as the shell read it, {"at": unix seconds
    on the operator's clock, "data": the JSON} (docs/pod-contract.md); answers that do not
    belong to the pod's attempt and index are ignored. `admission`: what Kueue says about a
    job queued through it (reconcile/admission.py), None for any other job. `view_of`: how a
    pod is read (observe.view; the shell passes one that remembers the views of the pods it
    has cached, which never change). `runtime`: what the job's spec.runtimeRef resolved to
    (reconcile/runtimeref.py), whose `job` is the one passed here; None for a job without one."""
    status = _migrated(json_copy(job.get("status") or {}))
    meta = job["metadata"]
    if meta.get("generation") is not None:
        status["observedGeneration"] = meta["generation"]
    status.setdefault("attempt", 0)
    status.setdefault("phase", Phase.PENDING)
    if runtime is not None and runtime.missing:
        return nospec.await_runtime(bare_ctx(job, pods, status, now, view_of), str(runtime.runtime))
    problem = runtime.problem if runtime is not None else None
    try:
        spec = JobSpec.model_validate(job.get("spec") or {})
    except ValidationError as err:
        if runtime is not None and runtime.own_spec is not None:
            problem = problem or explain(err, job["spec"], runtime.own_spec, str(runtime.runtime))
        else:
            problem = problem or f"invalid spec: {err}"
    if problem is not None:
        return nospec.invalid(bare_ctx(job, pods, status, now, view_of), problem)
    # A checkpoint a pod reports must lie in the job's checkpoint storage: it is what later
    # pods resume from (podinput.misplaced_checkpoint).
    mount = spec.checkpoint.mount_path if spec.checkpoint is not None else None
    views = [confined(view_of(p, spec.trainer.name), mount) for p in pods]
    uid = meta.get("uid")
    reads: dict[str, Live] = {}
    # Per pod uid, why its status answer was refused: by the reader, or here.
    refused_answers = {
        pod_uid: read["rejected"]
        for pod_uid, read in (live or {}).items()
        if isinstance(read, Mapping) and isinstance(read.get("rejected"), str)
    }
    for v in views:
        if v.uid and live and v.uid in live and v.attempt is not None:
            rdzv_id = names.rdzv_id(str(uid), v.attempt)
            parsed = parse_live(live[v.uid], rdzv_id, v.node_index, mount)
            if isinstance(parsed, Rejected):
                refused_answers[v.uid] = parsed.reason
            elif parsed is not None:
                reads[v.uid] = parsed
    ctx = Ctx(
        job=job,
        spec=spec,
        now=now.timestamp(),
        status=status,
        # Ownership is by controller uid alone: a pod with the job's labels but another
        # owner (or none) is never taken for the job's own, nor deleted.
        pods=[v for v in views if v.owner_uid == meta.get("uid")],
        taken={v.name for v in views},
        foreign={v.name for v in views if v.owner_uid != meta.get("uid")},
        blocked=list(blocked),
        refused=list(refused),
        live=reads,
    )
    ctx.counters  # noqa: B018 - materialise the counters so every status carries them
    status["worldSize"] = world_size(spec)
    if runtime is not None and runtime.resolved_now:
        rec = status["runtime"]
        message = f"{runtime.runtime} resolved (resourceVersion {rec.get('resourceVersion')})"
        ctx.set_cond(ConditionType.RUNTIME_RESOLVED, True, Reason.RUNTIME_RESOLVED, message)
        ctx.event("Normal", Reason.RUNTIME_RESOLVED, message)

    phase = status["phase"]
    waited = record_admission(ctx, admission) if phase not in FINISHED else None
    if phase in FINISHED:
        after_finish(ctx)
    elif spec.run_policy.suspend:
        suspend(ctx)
    elif admission is not None and not admission.admitted:
        queue(ctx, admission)
    else:
        if phase == Phase.SUSPENDED:
            resume(ctx)
        elif phase == Phase.QUEUED:
            admitted(ctx, waited)
        avoid_prune(ctx)
        if not deadline_passed(ctx):
            attempts.follow_spec(ctx)
            if ctx.phase in (Phase.PENDING, Phase.RESTARTING):
                before = json_copy(ctx.status)
                decided = len(ctx.transitions)
                start_attempt(ctx)
                if ctx.blocked:
                    # Nothing starts while something is in the way: the job stays as it was
                    # (Pending, or Restarting) and the Blocked condition says why.
                    ctx.status.clear()
                    ctx.status.update(before)
                    ctx.events.clear()
                    del ctx.transitions[decided:]
            else:
                observe(ctx)
        gang.record(ctx.status, spec, ctx.name)
        _report_blocked(ctx)
    say_refused(ctx, refused_answers)
    overdue.force(ctx)
    return ctx.plan()


def _report_blocked(ctx: Ctx) -> None:
    if ctx.blocked or ctx.refused:
        reason = Reason.OBJECT_IN_THE_WAY if ctx.blocked else Reason.POD_CREATE_REFUSED
        message = truncate("; ".join(sorted({*ctx.blocked, *ctx.refused}))) or ""
        old = cond.get(ctx.conds, ConditionType.BLOCKED) or {}
        flipped = ctx.set_cond(ConditionType.BLOCKED, True, reason, message)
        if flipped or old.get("reason") != reason:
            ctx.event("Warning", reason, message)
    elif cond.is_true(ctx.conds, ConditionType.BLOCKED):
        message = "nothing stands in the job's way"
        ctx.set_cond(ConditionType.BLOCKED, False, Reason.UNBLOCKED, message)


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON document (dicts, lists, scalars): copy.deepcopy's memo and
    dispatch made it a tenth of a big job's reconcile, copying a 512-entry status."""
    if type(value) is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [json_copy(v) for v in value]
    return value


def _migrated(status: dict[str, Any]) -> dict[str, Any]:
    """A status written before the pod index had its own field: its `nodeRank`s (in ranks,
    the failure and the restart records) were pod indexes, and become `index`."""

    for key in ("ranks", "restarts"):
        if isinstance(status.get(key), list):
            status[key] = [renamed(r) for r in status[key]]
    if isinstance(status.get("failure"), dict):
        status["failure"] = renamed(status["failure"])
    return status
