"""The end of a job: its phase and conditions, its pods per cleanPodPolicy, its TTL."""

from __future__ import annotations

from ..api.status_names import ConditionType, Phase, PodPhase
from ..api.timefmt import seconds
from . import conditions as cond
from .context import Ctx


def finish(ctx: Ctx, phase: Phase, reason: str, message: str) -> None:
    """Succeed or fail the job for good."""
    ctx.set_phase(phase)
    ctx.status["completionTime"] = ctx.stamp
    ctx.status.pop("avoidedNodes", None)  # released: the job runs no more pods
    ctx.set_cond(ConditionType(phase), True, reason, message)
    ctx.set_cond(ConditionType.RUNNING, False, reason, message)
    if cond.is_true(ctx.conds, ConditionType.RESTARTING):
        ctx.set_cond(ConditionType.RESTARTING, False, reason, message)
    ctx.event("Normal" if phase == Phase.SUCCEEDED else "Warning", phase, message)
    after_finish(ctx)


def after_finish(ctx: Ctx) -> None:
    """Clean pods per cleanPodPolicy, then delete the job once its TTL is due."""
    policy = ctx.spec.run_policy
    if policy.clean_pod_policy == "Delete":
        ctx.delete_pods(ctx.pods)
    elif policy.clean_pod_policy == "KeepFailed":
        ctx.delete_pods([p for p in ctx.pods if p.phase != PodPhase.FAILED])
    elif ctx.phase == Phase.SUCCEEDED and ctx.spec.success_policy == "RankZero":
        ctx.delete_pods([p for p in ctx.pods if not p.terminal])
    ttl = policy.ttl_seconds_after_finished
    done = seconds(ctx.status.get("completionTime"))
    if ttl is not None and done is not None:
        left = done + ttl - ctx.now
        if left <= 0:
            ctx.delete_job = True
        else:
            ctx.requeue.append(left)
