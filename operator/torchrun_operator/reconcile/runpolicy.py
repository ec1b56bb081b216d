"""runPolicy.suspend and runPolicy.activeDeadlineSeconds: suspending a job (its pods go),
resuming it (a fresh attempt, no restart spent), and failing it once its deadline passed."""

from __future__ import annotations

from ..api.status_names import ConditionType, Phase, Reason, RestartKind
from ..api.timefmt import seconds
from .context import Ctx, counts
from .finish import finish


def suspend(ctx: Ctx) -> None:
    ctx.delete_pods(ctx.pods)
    if ctx.phase != Phase.SUSPENDED:
        ctx.set_phase(Phase.SUSPENDED)
        message = "runPolicy.suspend is true; pods deleted"
        ctx.set_cond(ConditionType.SUSPENDED, True, Reason.SUSPENDED, message)
        ctx.set_cond(ConditionType.RUNNING, False, Reason.SUSPENDED, "job is suspended")
        ctx.event("Normal", Reason.SUSPENDED, f"Job suspended; deleting {len(ctx.delete)} pods")
    desired = ctx.spec.nodes
    ctx.status["nodes"] = counts(desired)


def resume(ctx: Ctx) -> None:
    """A resumed job starts a fresh attempt (its old rendezvous is gone) without spending
    the restart budget, and its deadline counts from now."""
    st = ctx.status
    if st.get("ranks"):
        st["attempt"] = ctx.attempt + 1
        ctx.record_restart({"reason": Reason.RESUMED, "kind": RestartKind.SUSPEND})
    ctx.set_phase(Phase.PENDING)
    st.pop("startTime", None)
    ctx.set_cond(ConditionType.SUSPENDED, False, Reason.RESUMED, "runPolicy.suspend is false")
    ctx.event("Normal", Reason.RESUMED, f"Job resumed; starting attempt {ctx.attempt}")


def deadline_passed(ctx: Ctx) -> bool:
    limit = ctx.spec.run_policy.active_deadline_seconds
    start = seconds(ctx.status.get("startTime"))
    if limit is None or start is None:
        return False
    left = start + limit - ctx.now
    if left > 0:
        ctx.requeue.append(left)
        return False
    message = f"runPolicy.activeDeadlineSeconds ({limit}s) passed"
    finish(ctx, Phase.FAILED, Reason.DEADLINE_EXCEEDED, message)
    return True
