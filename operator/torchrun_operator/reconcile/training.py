"""What the running attempt's live reads say in the status: status.progress (the attempt's
steps), status.lastCheckpoint (the job's), and the Straggler condition
(spec.monitoring.straggler). The arithmetic is progress.py's; this module writes its results
into the reconciliation's status."""

from __future__ import annotations

from ..api.status_names import ConditionType, Phase, Reason
from . import conditions as cond
from . import crashloop
from . import progress as prog
from .context import Ctx, Seen
from .observe import Live, truncate


def _live_by_index(ctx: Ctx, seen: Seen) -> dict[int, Live]:
    out = {}
    for i, pod in seen.current.items():
        lv = ctx.live.get(pod.uid or "")
        if lv is not None and not pod.terminal:
            out[i] = lv
    return out


def record_progress(ctx: Ctx, seen: Seen) -> None:
    """status.progress of the current attempt, from its pods' steps; status.lastCheckpoint,
    of the job, from what its pods reported."""
    st = ctx.status
    before = st.get("progress")
    live = _live_by_index(ctx, seen)
    reports = prog.checkpoints(live, [p.report for p in seen.current.values()])
    checkpoint = prog.last_checkpoint(reports, st.get("lastCheckpoint"), ctx.stamp)
    if checkpoint is not None:
        st["lastCheckpoint"] = checkpoint
    found = prog.job_progress(st["ranks"], live, before)
    if found is None:
        st.pop("progress", None)
        return
    start = crashloop.start_step(before, found["step"], failed=bool(seen.failed))
    if start is not None:
        found[crashloop.START_STEP] = start
    st["progress"] = found


def record_stragglers(ctx: Ctx, seen: Seen) -> None:
    """The Straggler condition (spec.monitoring.straggler): the pods whose mean step time over
    the window stays above factor times the median."""
    config = ctx.spec.monitoring.straggler
    if config is None:
        # Turned off (the spec changes while suspended): no stale verdict stays behind.
        ctx.conds[:] = [c for c in ctx.conds if c.get("type") != ConditionType.STRAGGLER]
        return
    exists = cond.get(ctx.conds, ConditionType.STRAGGLER) is not None
    if ctx.phase != Phase.RUNNING:
        if cond.is_true(ctx.conds, ConditionType.STRAGGLER):
            message = "the attempt is not running"
            ctx.set_cond(ConditionType.STRAGGLER, False, Reason.NOT_RUNNING, message)
        return
    found = prog.stragglers(ctx.status["ranks"], _live_by_index(ctx, seen), config.factor)
    if found is None:
        if not exists:
            ctx.set_cond(
                ConditionType.STRAGGLER,
                False,
                Reason.MEASURING,
                f"waiting for {config.window_seconds}s of steps from at least two pods",
            )
        return
    slow, median = found
    if not slow:
        ctx.set_cond(
            ConditionType.STRAGGLER,
            False,
            Reason.NO_STRAGGLERS,
            f"every pod's step time is within {config.factor:g}x the median "
            f"({median:.3g}s per step over {config.window_seconds}s)",
        )
        return
    message = (
        truncate(prog.straggler_message(slow, median, config.factor, config.window_seconds)) or ""
    )
    if ctx.set_cond(ConditionType.STRAGGLER, True, Reason.SLOW_PODS, message):
        ctx.event("Warning", Reason.STRAGGLER, message)
