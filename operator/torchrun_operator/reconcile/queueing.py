"""Jobs queued through Kueue: what the reconciler does with what Kueue says about the job's
Workload (reconcile/admission.py reads the Workload; docs/scheduling.md, "Kueue").

Waiting for admission, or evicted (preempted, deactivated), a job is like a suspended one:
its pods are deleted and none is created, and no failure or restart is counted. Admitted
(again), it starts a fresh attempt without spending its restart budget."""

from __future__ import annotations

from ..api.status_names import ConditionType, Phase, Reason, RestartKind
from . import conditions as cond
from .admission import Admission
from .context import Ctx, counts


def record_admission(ctx: Ctx, admission: Admission | None) -> str | None:
    """The Admitted condition says what Kueue said, in its words; jobs not queued through
    Kueue have none. Returns the reason the job waited for until now, if it waited."""
    if admission is None:
        return None
    old = dict(cond.get(ctx.conds, ConditionType.ADMITTED) or {})  # set_cond updates in place
    ctx.set_cond(ConditionType.ADMITTED, admission.admitted, admission.reason, admission.message)
    return str(old["reason"]) if old.get("status") == "False" and old.get("reason") else None


def queue(ctx: Ctx, admission: Admission) -> None:
    """Not admitted, or evicted: delete the pods, create none. Kueue's quota is released
    (reconcile/admission.py) once the pods are gone."""
    if ctx.phase == Phase.SUSPENDED:
        ctx.set_cond(ConditionType.SUSPENDED, False, Reason.RESUMED, "runPolicy.suspend is false")
    ctx.delete_pods(ctx.pods)
    if ctx.phase != Phase.QUEUED:
        if ctx.phase not in (Phase.PENDING, Phase.SUSPENDED):
            ctx.set_cond(ConditionType.RUNNING, False, admission.reason, admission.message)
            message = f"{admission.message}; deleting {len(ctx.delete)} pods"
            ctx.event("Warning", Reason.EVICTED, message)
        ctx.set_phase(Phase.QUEUED)
        ctx.event("Normal", Reason.QUEUED, f"Waiting for Kueue: {admission.message}")
    ctx.status["nodes"] = counts(ctx.spec.nodes)


def admitted(ctx: Ctx, waited: str | None) -> None:
    """Admitted (again): a job that had started pods starts a fresh attempt (its rendezvous
    is gone) without spending its restart budget, and its deadline counts from now. The
    restart record names what it waited for (e.g. Preempted, Deactivated)."""
    if ctx.status.get("ranks"):
        ctx.status["attempt"] = ctx.attempt + 1
        ctx.record_restart({"reason": waited or Reason.READMITTED, "kind": RestartKind.SUSPEND})
    ctx.set_phase(Phase.PENDING)
    ctx.status.pop("startTime", None)
    ctx.event("Normal", Reason.ADMITTED, f"Admitted by Kueue; starting attempt {ctx.attempt}")
