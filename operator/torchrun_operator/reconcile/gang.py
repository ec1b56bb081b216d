"""Gang scheduling in the status: which gang objects the current attempt owns (recorded before
the shell creates them and deletes older attempts'), and why pods wait to be scheduled (the
Scheduled condition, and the Waiting phase it implies)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api.spec import JobSpec
from ..api.status_names import ConditionType, Reason
from ..render.gang import gang_name, min_member
from . import conditions as cond
from .context import Ctx, Seen
from .observe import PodView, truncate

# Why a pod is not bound yet, as the scheduler says in its PodScheduled condition.
SCHEDULER_REASONS = ("Unschedulable", "SchedulingGated", "SchedulerError")


def record(status: dict[str, Any], spec: JobSpec, job_name: str) -> None:
    """status.scheduling names the current attempt's gang objects (none without a gang). The
    shell creates exactly these, and deletes the job's gang objects of other attempts only
    once a status naming them is written."""
    gang = spec.scheduling.gang
    if gang == "None":
        status.pop("scheduling", None)
        return
    attempt = int(status.get("attempt") or 0)
    status["scheduling"] = {
        "gang": gang,
        "attempt": attempt,
        "podGroup": gang_name(job_name, attempt),
    }


def waiting(
    pods: Mapping[int, PodView], desired: int, spec: JobSpec, status: Mapping[str, Any]
) -> tuple[str, str] | None:
    """(reason, message) while pods of the attempt wait for the scheduler and it said why
    (their PodScheduled condition), else None. Under a gang the message names the group and
    how many pods it places together."""
    unbound = [
        (i, p)
        for i, p in sorted(pods.items())
        if p.node is None and p.phase == "Pending" and not p.terminating
    ]
    told = [(i, p) for i, p in unbound if p.reason in SCHEDULER_REASONS]
    if not told:
        return None
    first_index, first = told[0]
    reason = first.reason or "Unschedulable"
    detail = f"pod {first.name} (index {first_index}): {first.message or reason}"
    head = f"{len(unbound)} of {desired} pods not scheduled"
    gang = spec.scheduling.gang
    if gang != "None":
        group = (status.get("scheduling") or {}).get("podGroup")
        head += f"; {gang} gang scheduling places {min_member(spec)} pods together or none" + (
            f" (PodGroup {group})" if group else ""
        )
    return reason, truncate(f"{head}; {detail}") or ""


def scheduling(ctx: Ctx, seen: Seen) -> bool:
    """The Scheduled condition, False while the scheduler says it cannot place pods (a gang
    that does not fit, a topology domain, resources); it appears only once a pod had to wait.
    True while the job waits so (its phase is then Waiting). Reads status.nodes, written
    from the same pods before: every pod is bound once its `scheduled` count is the desired."""
    desired = ctx.spec.nodes
    why = waiting(seen.current, desired, ctx.spec, ctx.status)
    if why is not None:
        if ctx.set_cond(ConditionType.SCHEDULED, False, *why):
            ctx.event("Normal", Reason.WAITING, why[1])
    elif (
        cond.get(ctx.conds, ConditionType.SCHEDULED) and ctx.status["nodes"]["scheduled"] == desired
    ):
        message = f"all {desired} pods scheduled"
        ctx.set_cond(ConditionType.SCHEDULED, True, Reason.ALL_PODS_SCHEDULED, message)
    return why is not None
