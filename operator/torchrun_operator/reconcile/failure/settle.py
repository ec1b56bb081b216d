"""When failures are acted on, and on whose clock.

While other pods still run, their reports may name the real culprit: when rank 3 raises on
the store host, the other node's agent often dies first, of a lost store connection. So a
failure that restarting may fix waits until every pod has ended, or SETTLE_SECONDS after the
first report; lost pods need no settling (nothing another node reports can explain them
away). A collective that did not complete, with no rank named outside it yet, waits longer:
the rank the others waited for is in a pod still running, whose launcher names it only once
its agent has stopped. That agent hears of the failure from the closed rendezvous, or, when
the pod that held the store has ended and its address is gone, only once torch's store client
gives up reconnecting (about 10 s with torch 2.15, measured; more on a busy node). Times are
the operator's: node clocks may be off by any amount.
"""

from __future__ import annotations

from dataclasses import replace

from ...api.timefmt import seconds
from ..context import Ctx, Seen, entries, node_ranks
from ..rootcause import WINDOW, Candidate, absentee_unknown

# A failure that restarting may fix is acted on only once the other nodes have had time to
# report, or have all stopped: their reports may hold the exception that really caused it.
SETTLE_SECONDS = 2 * WINDOW
# How long a collective failure with no absentee named yet waits for the pods still running:
# three times the store client's 10 s give-up, for a busy node. Acted on at once when every
# pod has ended, so only a rank that truly never reports costs the whole wait.
COLLECTIVE_SETTLE_SECONDS = 30.0 + WINDOW
# How long before the operator sees a pod's failure it can have happened, on the operator's
# clock (the agent's report, the kubelet's status sync, the watch). Node-reported times are
# clamped to it; with the 1 s of whole-second stamps it stays inside the root-cause WINDOW.
REPORT_LAG = 2.0
# How long before its report a failure the report holds may have happened. A report that says
# when it was written (reportedAt, on the node's clock like the failure's own time) tells the
# failure's age, which no clock offset changes: a worker that raised and was slow to exit, in
# a pod whose agent ended only when a peer's failure closed the rendezvous (or its store went,
# about 10 s later), or was told to stop, is reported well after its failure. Bounded: torch
# stops workers within its shutdown timeout (30 s), the store client gives up within tens of
# seconds; a pod's claims beyond that are cut, so one pod can move its failure back in time
# by no more than this.
MAX_REPORT_AGE = 120.0


def observed_at(ctx: Ctx) -> dict[int, float]:
    """Per pod index, when the operator first saw its pod fail (its own clock)."""
    out: dict[int, float] = {}
    for entry in entries(ctx.status):
        at = seconds(entry.get("failureObservedAt"))
        if at is not None:
            out[int(entry["index"])] = at
    return out


def with_node_rank(ctx: Ctx, c: Candidate) -> Candidate:
    if c.node_rank is not None:
        return c
    return replace(c, node_rank=node_ranks(ctx).get(c.node_index))


def on_operator_clock(ctx: Ctx, candidates: list[Candidate]) -> list[Candidate]:
    """Node clocks may be off by any amount. A failure happened before the operator saw it,
    and (the operator watching all along) not long before: each reported time is clamped
    into [seen - REPORT_LAG, seen + 1 s] (the status keeps whole seconds). Clamping is
    monotonic, so reports seen together keep their order; a node an hour ahead cannot
    postpone its failure, and one far behind cannot put a consequence (a lost connection)
    before its cause by more than a few seconds, within WINDOW, where an exception outranks
    it. A report that says when it was written places each failure by its age instead
    (_placed): one recorded long before its pod ended keeps its place."""
    observed = observed_at(ctx)
    out = []
    for c in candidates:
        seen = observed.get(c.node_index)
        if seen is not None:
            c = replace(c, at=_placed(c, seen))
        out.append(c)
    return out


def _placed(c: Candidate, seen: float) -> float:
    """A reported failure's time on the operator's clock, the pod's end seen at `seen`: its age
    at the report when the report tells it (its own clock's difference, bounded by
    MAX_REPORT_AGE), else clamped near `seen` as above."""
    if c.reported_at is not None:
        return seen - min(max(c.reported_at - c.at, 0.0), MAX_REPORT_AGE)
    return min(max(c.at, seen - REPORT_LAG), seen + 1.0)


def waiting(ctx: Ctx, seen: Seen, cause: Candidate) -> bool:
    """Whether to wait for more reports before acting (a requeue is planned for when the
    window ends): some pods still run and the first report is less than SETTLE_SECONDS old
    (COLLECTIVE_SETTLE_SECONDS when a collective failed and no launcher named the rank outside
    it yet). `cause`: the root cause of `seen.candidates`. Measured on the operator's clock
    (when it saw each failure), never a node's."""
    observed = observed_at(ctx)
    reported = [observed.get(c.node_index, c.at) for c in seen.candidates if c.kind != "lost"]
    if not seen.alive or not reported:
        return False
    unknown = absentee_unknown(cause, seen.candidates)
    settle_at = min(reported) + (COLLECTIVE_SETTLE_SECONDS if unknown else SETTLE_SECONDS)
    if ctx.now < settle_at:
        ctx.requeue.append(settle_at - ctx.now)
        return True
    return False
