"""Pods of the running attempt failed: what the job does about it."""

from __future__ import annotations

from ...api.status_names import Reason
from ..context import Ctx, Seen
from ..rootcause import classify, root_cause
from . import replace as elastic
from . import settle
from .hang_policy import name_absentees
from .restart import fail_or_restart


def on_failures(ctx: Ctx, seen: Seen) -> None:
    """Find the root cause across the failed pods; then replace them (elastic), wait for the
    other pods' reports (settle), or fail the job or decide a gang restart."""
    retryable = ctx.spec.failure_policy.retryable_exit_codes
    seen.candidates = [
        settle.with_node_rank(ctx, c) for c in settle.on_operator_clock(ctx, seen.candidates)
    ]
    cause = root_cause(seen.candidates)
    klass = classify(cause, retryable)
    if elastic.applies(ctx, seen):
        elastic.replace(ctx, seen, cause)
        return
    # A rendezvous timeout is decided at once, on the pods as they are now: no training ran,
    # so no report can explain it away, and waiting lets a Pending pod start in the room the
    # failed ones freed, hiding why the rendezvous failed.
    rendezvous_timeout = cause.kind == "rendezvous" and cause.reason == Reason.RENDEZVOUS_TIMEOUT
    if rendezvous_timeout:
        cause = name_absentees(ctx, seen, cause)
    elif settle.waiting(ctx, seen, cause):
        return
    fail_or_restart(ctx, cause, klass)
