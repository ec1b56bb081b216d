"""Hangs no launcher reports (the detection rules are reconcile/hang.py): a rendezvous that
never completes with every pod Running, and (opt-in, runPolicy.progressTimeoutSeconds) pods
that stopped reporting training progress. Either ends the attempt like a failure. Their timers
run on the operator's clock, from the times it keeps in status.ranks[] (hang.observed)."""

from __future__ import annotations

from dataclasses import replace

from ...api.status_names import ConditionType, Reason
from ...api.timefmt import seconds
from .. import conditions as cond
from .. import hang
from ..context import Ctx, Seen, entries, node_ranks
from ..observe import truncate
from ..rootcause import Candidate, classify
from .restart import fail_or_restart


def name_absentees(ctx: Ctx, seen: Seen, cause: Candidate) -> Candidate:
    """A rendezvous timeout is caused by the pods that never arrived: name them (the first
    as the failure's pod), not the launcher that gave up waiting."""
    join = ctx.spec.rendezvous.join_timeout_seconds
    watched = hang.watched(entries(ctx.status))
    absent = hang.absentees(seen.slots, watched, ctx.now, join, seen.started_now)
    if not absent:
        return cause
    missing = {a.node_index for a in absent}
    waited = [seen.slots[i][0] for i in sorted(seen.slots) if i not in missing]
    first = absent[0]
    message = hang.rendezvous_timeout_message(absent, waited, join)
    return replace(
        cause,
        node_index=first.node_index,
        pod=first.pod,
        node=first.node,
        rank=None,
        node_rank=None,
        exit_code=None,
        message=truncate(message),
    )


def hung(ctx: Ctx, seen: Seen, joined: bool = False) -> bool:
    """True when the attempt hangs: then it failed, or a gang restart is decided. `joined`:
    every pod is past the rendezvous now (running._past_rendezvous), though RendezvousDone may
    not be set yet."""
    spec = ctx.spec
    join = spec.rendezvous.join_timeout_seconds
    rdzv = cond.get(ctx.conds, ConditionType.RENDEZVOUS_DONE)
    recorded = rdzv is not None and rdzv.get("status") == "True"
    done = recorded or joined
    pods = {i: pod for i, (_, pod) in seen.slots.items()}
    watched = hang.watched(entries(ctx.status))
    deadline = hang.rendezvous_hang_deadline(pods, watched, done, join)
    if deadline is not None and ctx.now < deadline:
        ctx.requeue.append(deadline - ctx.now)
    elif deadline is not None:
        absent = hang.absentees(seen.slots, watched, ctx.now, join)
        first = absent[0]  # not every pod is Ready, so someone is absent
        message = truncate(hang.rendezvous_hang_message(absent, join))
        cause = Candidate(
            first.node_index,
            first.pod,
            first.node,
            "rendezvous",
            Reason.RENDEZVOUS_TIMEOUT,
            deadline,
            message=message,
        )
        fail_or_restart(ctx, cause, "user")
        return True
    timeout = spec.run_policy.progress_timeout_seconds
    if timeout is None or not done:
        return False
    ranks_by_index = node_ranks(ctx)
    # Seen only now (the condition is set after this check): the stall counts from now.
    rendezvous_at = seconds(rdzv.get("lastTransitionTime")) if recorded and rdzv else ctx.now
    quiet = hang.quiet_pods(seen.current, watched, rendezvous_at, ranks_by_index)
    due, wait = hang.stalled(quiet, ctx.now)
    if wait is not None:
        ctx.requeue.append(wait)
    if not due:
        return False
    for q in due:
        entry = ctx.status["ranks"][q.node_index]
        entry["reason"] = Reason.PROGRESS_STALLED
        entry["message"] = f"no training progress for {timeout}s"
    quiet_first = due[0]
    message = hang.stall_message(due, timeout)
    cause = Candidate(
        quiet_first.node_index,
        quiet_first.pod,
        quiet_first.node,
        "stalled",
        Reason.PROGRESS_STALLED,
        quiet_first.since,
        node_rank=quiet_first.node_rank,
    )
    culprit = hang.outside_collective(
        {i: (p.name, ctx.live.get(p.uid or "")) for i, p in seen.current.items()}, watched
    )
    if culprit is not None:
        # The stacks the launchers dumped name the rank that is not waiting in a collective:
        # it is the one the others wait for.
        index, stack, others_waiting = culprit
        pod = seen.current[index]
        message = hang.culprit_message(stack, pod.name, others_waiting) + "; " + message
        cause = replace(
            cause,
            node_index=index,
            pod=pod.name,
            node=pod.node,
            rank=stack.rank,
            node_rank=ranks_by_index.get(index),
            location=stack.location,
        )
    cause = replace(cause, message=truncate(message))
    fail_or_restart(ctx, cause, classify(cause, spec.failure_policy.retryable_exit_codes))
    return True
