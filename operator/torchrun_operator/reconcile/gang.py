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
from .failure.avoid import current
from .observe import PodView, truncate

# Why a pod is not bound yet, as the scheduler says in its PodScheduled condition.
SCHEDULER_REASONS = ("Unschedulable", "SchedulingGated", "SchedulerError")
# What kube-scheduler's NodeAffinity filter says of nodes a pod's required node affinity
# rules out ("N node(s) didn't match Pod's node affinity/selector"); the avoided nodes are
# ruled out that way (render/placement.py).
NODE_AFFINITY_WORDS = "node affinity"


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


def _kept_off(pod: PodView, avoided: Mapping[str, str]) -> list[str]:
    """The avoided nodes an unschedulable pod is kept off, when the scheduler says nodes did
    not match its node affinity; else none."""
    if pod.reason != "Unschedulable" or NODE_AFFINITY_WORDS not in (pod.message or ""):
        return []
    return sorted(pod.avoided & avoided.keys())


def waiting(
    pods: Mapping[int, PodView],
    desired: int,
    spec: JobSpec,
    status: Mapping[str, Any],
    avoided: Mapping[str, str] | None = None,
) -> tuple[str, str] | None:
    """(reason, message) while pods of the attempt wait for the scheduler and it said why
    (their PodScheduled condition), else None. Under a gang the message names the group and
    how many pods it places together. `avoided`: the nodes kept off now, each with when its
    time is up (status.avoidedNodes); when a waiting pod is kept off some and the scheduler
    says nodes did not match its node affinity, the reason is AvoidedNodes and the message
    names them, and when the pods are created again without them."""
    unbound = [
        (i, p)
        for i, p in sorted(pods.items())
        if p.node is None and p.phase == "Pending" and not p.terminating
    ]
    told = [(i, p) for i, p in unbound if p.reason in SCHEDULER_REASONS]
    if not told:
        return None
    avoided = avoided or {}
    kept_off = [(i, p) for i, p in told if _kept_off(p, avoided)]
    first_index, first = (kept_off or told)[0]
    reason = Reason.AVOIDED_NODES if kept_off else first.reason or "Unschedulable"
    detail = f"pod {first.name} (index {first_index}): {first.message or reason}"
    head = f"{len(unbound)} of {desired} pods not scheduled"
    gang = spec.scheduling.gang
    if gang != "None":
        group = (status.get("scheduling") or {}).get("podGroup")
        head += f"; {gang} gang scheduling places {min_member(spec)} pods together or none" + (
            f" (PodGroup {group})" if group else ""
        )
    if kept_off:
        nodes = ", ".join(f"{n} (until {avoided[n]})" for n in _kept_off(first, avoided))
        head += (
            f"; the job keeps its pods off avoided nodes {nodes} and the scheduler finds no"
            " other node matching their node affinity; a pod waiting so is created again"
            " without a node once that node is no longer avoided"
        )
    return reason, truncate(f"{head}; {detail}") or ""


def recreated(seen: Seen) -> tuple[str, str] | None:
    """(reason, message) while pods go to be created again without nodes no longer avoided
    (reconcile/failure/avoid.py), else None."""
    if not seen.recreated:
        return None
    indexes = ", ".join(str(i) for i in sorted(seen.recreated))
    message = (
        f"pods of index {indexes} kept off nodes no longer avoided: created again without"
        " them, to be placed"
    )
    return Reason.AVOIDANCE_LIFTED, message


def scheduling(ctx: Ctx, seen: Seen) -> bool:
    """The Scheduled condition, False while the scheduler says it cannot place pods (a gang
    that does not fit, a topology domain, resources); it appears only once a pod had to wait.
    True while the job waits so (its phase is then Waiting). Reads status.nodes, written
    from the same pods before: every pod is bound once its `scheduled` count is the desired."""
    desired = ctx.spec.nodes
    avoided = {e["node"]: str(e["until"]) for e in current(ctx.status, ctx.now)}
    why = waiting(seen.current, desired, ctx.spec, ctx.status, avoided) or recreated(seen)
    if why is not None:
        before = (cond.get(ctx.conds, ConditionType.SCHEDULED) or {}).get("reason")
        flipped = ctx.set_cond(ConditionType.SCHEDULED, False, *why)
        if flipped or (why[0] == Reason.AVOIDED_NODES and before != why[0]):
            ctx.event("Normal", Reason.WAITING, why[1])
    elif (
        cond.get(ctx.conds, ConditionType.SCHEDULED) and ctx.status["nodes"]["scheduled"] == desired
    ):
        message = f"all {desired} pods scheduled"
        ctx.set_cond(ConditionType.SCHEDULED, True, Reason.ALL_PODS_SCHEDULED, message)
    return why is not None
