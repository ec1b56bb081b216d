"""Stop restarting when an attempt failed like the one before it and made no progress
(failurePolicy.crashLoopDetection; the signature and step rules are reconcile/crashloop.py)."""

from __future__ import annotations

from ...api.status_names import Phase, Reason
from .. import crashloop
from ..context import Ctx
from ..finish import finish
from ..observe import truncate
from ..rootcause import Candidate
from .cause import describe


def crash_loop(ctx: Ctx, cause: Candidate, signature: str | None, step: int | None) -> bool:
    """Fail the job (CrashLoopNoProgress) when this attempt failed like the one before it
    and made no progress. True when it did."""
    before = crashloop.previous_failure(ctx.status.get("restarts") or [], ctx.attempt)
    if signature is None or before.get("signature") != signature:
        return False
    previous = before.get("step")
    previous = previous if isinstance(previous, int) and not isinstance(previous, bool) else None
    progress = ctx.status.get("progress") or {}
    start = progress.get(crashloop.START_STEP)
    start = start if isinstance(start, int) and not isinstance(start, bool) else None
    reports = (p.report for p in ctx.pods if p.attempt == ctx.attempt)
    final = crashloop.last_step_known(cause.kind == "stalled", reports)
    if not crashloop.made_no_progress(step, start, previous, final):
        return False
    here = "before its first step" if step is None else f"at step {step}"
    if step is not None and step != previous:
        here += " (the first step seen of it)"  # no progress past its own start
    message = truncate(
        f"attempt {ctx.attempt} failed {here}, no further than attempt {ctx.attempt - 1} "
        f"(step {previous}), with the same error ({signature}); not restarting "
        f"(failurePolicy.crashLoopDetection). Last failure: {describe(cause)}"
    )
    finish(ctx, Phase.FAILED, Reason.CRASH_LOOP_NO_PROGRESS, message or "")
    return True
