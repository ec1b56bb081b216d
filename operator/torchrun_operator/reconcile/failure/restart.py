"""Gang restarts: the whole attempt is replaced by the next one, within a restart budget.

A user error (the training program failed) fails the job: restarting it would fail the same
way. Anything else (a pod or node lost, a retryable exit code) restarts every pod under a new
attempt, after an exponential back-off, until failurePolicy.maxRestarts is spent or the
attempts loop without progress (crashloop_policy).
"""

from __future__ import annotations

from ...api.spec import JobSpec
from ...api.status_names import ConditionType, Phase, Reason, RestartKind
from .. import conditions as cond
from .. import crashloop
from ..context import Ctx
from ..finish import finish
from ..observe import truncate
from ..rootcause import Candidate
from . import avoid
from .cause import describe, record_failure
from .crashloop_policy import crash_loop


def backoff(spec: JobSpec, restarts: int) -> float:
    """Seconds between the decision of the `restarts`-th restart and its attempt's start."""
    policy = spec.failure_policy
    raw = policy.backoff_seconds * 2 ** max(restarts - 1, 0)
    return float(min(raw, policy.max_backoff_seconds))


def budget_spent(ctx: Ctx, needed: int) -> bool:
    """Whether `needed` more restarts would pass failurePolicy.maxRestarts."""
    return ctx.counters["restarts"] + needed > ctx.spec.failure_policy.max_restarts


def fail_spent(ctx: Ctx, cause: Candidate) -> None:
    """Fail the job: the restart budget is spent."""
    budget = ctx.spec.failure_policy.max_restarts
    message = f"failurePolicy.maxRestarts ({budget}) spent; last failure: {describe(cause)}"
    finish(ctx, Phase.FAILED, Reason.RESTART_BUDGET_EXHAUSTED, truncate(message) or "")


def fail_or_restart(ctx: Ctx, cause: Candidate, klass: str) -> None:
    """Record the root cause; fail on a user error, a spent budget or a crash loop, else
    decide a gang restart (phase Restarting: the caller starts the next attempt)."""
    counters = ctx.counters
    step = crashloop.attempt_step(ctx.status.get("ranks") or [])
    record_failure(ctx, cause, step)
    if klass == "user":
        counters["userFailures"] += 1
        finish(ctx, Phase.FAILED, cause.reason, describe(cause))
        return
    counters["infrastructureFailures"] += 1
    signature = crashloop.signature(cause)
    if ctx.spec.failure_policy.crash_loop_detection and crash_loop(ctx, cause, signature, step):
        return
    if budget_spent(ctx, 1):
        fail_spent(ctx, cause)
        return
    avoid.avoid(ctx, cause)  # recorded with the decision: the next attempt keeps off the node
    gang_restart(ctx, cause, step, signature)


def gang_restart(
    ctx: Ctx, cause: Candidate, step: int | None = None, signature: str | None = None
) -> None:
    """Decide the next attempt; the caller starts it (at once when nothing is left to wait
    for)."""
    st = ctx.status
    st["attempt"] = ctx.attempt + 1
    ctx.set_phase(Phase.RESTARTING)
    st["lastRestartTime"] = ctx.stamp
    ctx.record_restart(
        {
            "reason": cause.reason,
            "rank": cause.rank,
            "index": cause.node_index,
            "nodeRank": cause.node_rank,
            # Only infrastructure failures (a retryable exit code included) are restarted;
            # user errors fail the job.
            "kind": RestartKind.INFRASTRUCTURE,
            # The failed attempt's: the next one is judged against them (crash loops).
            "step": step,
            "signature": signature,
        },
    )
    restarts = ctx.counters["restarts"]
    delay = backoff(ctx.spec, restarts)
    message = (
        f"gang restart {restarts}/{ctx.spec.failure_policy.max_restarts}: "
        f"attempt {ctx.attempt} starts after {delay:g}s back-off"
    )
    ctx.set_cond(ConditionType.RESTARTING, True, cause.reason, message)
    ctx.set_cond(ConditionType.RUNNING, False, Reason.RESTARTING, message)
    ctx.set_cond(ConditionType.RENDEZVOUS_DONE, False, Reason.RESTARTING, message)
    if cond.is_true(ctx.conds, ConditionType.STRAGGLER):
        ctx.set_cond(ConditionType.STRAGGLER, False, Reason.NOT_RUNNING, message)
    ctx.event("Warning", Reason.RESTARTING, message)
    st.pop("progress", None)
