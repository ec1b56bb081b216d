"""Node-aware recovery: after a failure that was the node's, the job's next pods keep off it.

A failure is the node's when its text says the GPU or node is bad (reconcile/failurekinds.py:
an uncorrectable ECC error, a GPU fallen off the bus...), or when the pod went with its node:
the node stopped answering (NodeLost; DeletionByTaintManager, the not-ready or unreachable
taint's eviction), the node was deleted (DeletionByPodGC), or the kubelet evicted the pod for
node pressure (Evicted, TerminationByKubelet). A pod deleted by someone, preempted or drained
through the eviction API is not the node's doing.

Intent first: the node goes into status.avoidedNodes in the same status write as the decision
(the gang restart or the elastic replacement); every pod rendered afterwards, by this reconcile
or a later one, reads the list from status and carries a required node affinity that keeps it
off those nodes (render/placement.py). The list is bounded: at most MAX_NODES nodes (the
oldest leave first) for AVOID_SECONDS each, and it is cleared when the job ends.

A pod's affinity is fixed when it is created, so a pod still waiting for the scheduler when a
node leaves the list (its time is up, or newer ones pushed it out) would stay kept off that
node for good: on a pool of exactly the job's size, never placed. Such a pod is deleted and
created again from the current list (`recreate`): the status.ranks entry says so first
(phase Creating, reason AvoidanceLifted), so that its going is not taken for a failure. The
reconciler looks again when the first entry's time is up (`prune`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...api.status_names import PodPhase, RankPhase, Reason
from ...api.timefmt import fmt, seconds
from ..context import Ctx
from ..observe import PodView
from ..rootcause import Candidate

# At most this many nodes are kept off at once: a job must not run out of nodes because a
# flaky one after another failed it.
MAX_NODES = 3
# For this long after the failure (the node may be repaired, drained or replaced by then).
AVOID_SECONDS = 3600

# Pod losses that are the node's: reasons of lost candidates (DisruptionTarget reasons, the
# pod's reason) and NodeLost (the pod's phase Unknown).
NODE_REASONS = frozenset(
    (
        Reason.NODE_LOST,
        "DeletionByTaintManager",
        "DeletionByPodGC",
        "TerminationByKubelet",
        "Evicted",
    )
)


def blamed_node(cause: Candidate) -> str | None:
    """The node to blame for the failure, None when it is not the node's."""
    if not cause.node:
        return None
    table = cause.table
    if (table is not None and table.node) or cause.reason in NODE_REASONS:
        return cause.node
    return None


def current(status: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """status.avoidedNodes still in force at `now`."""
    out = []
    for entry in status.get("avoidedNodes") or []:
        until = seconds(entry.get("until")) if isinstance(entry, dict) else None
        if until is not None and until > now and isinstance(entry.get("node"), str):
            out.append(entry)
    return out


def prune(ctx: Ctx) -> None:
    """Drop the entries whose time is up from status.avoidedNodes (the list, when none is
    left), so that the status shows only nodes still kept off; look again when the next one's
    time is up (pods waiting to be placed are then created again without it)."""
    entries = ctx.status.get("avoidedNodes")
    if entries is None:
        return
    kept = current(ctx.status, ctx.now)
    if not kept:
        ctx.status.pop("avoidedNodes", None)
        return
    if len(kept) != len(entries):
        ctx.status["avoidedNodes"] = kept
    ctx.requeue.append(min(seconds(e["until"]) or ctx.now for e in kept) - ctx.now)


def nodes(ctx: Ctx) -> list[str]:
    """The nodes pods rendered now keep off, sorted."""
    return sorted({e["node"] for e in current(ctx.status, ctx.now)})


def avoid(ctx: Ctx, cause: Candidate) -> bool:
    """Record the failure's node in status.avoidedNodes when the failure was the node's, with
    an event naming node and why. True when it did."""
    node = blamed_node(cause)
    if node is None:
        return False
    kept = [e for e in current(ctx.status, ctx.now) if e["node"] != node]
    until = ctx.now + AVOID_SECONDS
    entry = {
        "node": node,
        "reason": cause.reason,
        "kind": cause.shown_kind,
        "index": cause.node_index,
        "since": ctx.stamp,
        "until": fmt(until),
    }
    ctx.status["avoidedNodes"] = [*kept, entry][-MAX_NODES:]
    ctx.event(
        "Warning",
        Reason.AVOIDING_NODE,
        f"node {node}: {cause.reason} ({cause.shown_kind}) of pod {cause.pod}; the job's pods "
        f"keep off it until {fmt(until)}",
    )
    return True


def lifted(ctx: Ctx, pod: PodView) -> list[str]:
    """The nodes `pod` was rendered to keep off that are avoided no longer, sorted."""
    return sorted(pod.avoided - set(nodes(ctx)))


def recreating(pod: PodView, before: Mapping[str, Any]) -> bool:
    """Whether the status already says `pod` goes to be created again (recreate)."""
    return before.get("pod") == pod.name and before.get("reason") == Reason.AVOIDANCE_LIFTED


def recreate(
    ctx: Ctx, index: int, pod: PodView, before: Mapping[str, Any]
) -> dict[str, Any] | None:
    """When `pod`, of the current attempt, waits to be placed (Pending, not bound) and is kept
    off a node no longer avoided: plan its delete and return its status.ranks entry (phase
    Creating: the pod of that name is created again, from the current list, once it is gone;
    reason AvoidanceLifted). Once the status says so, the pod still seen (bound meanwhile, or
    Terminating) is that same decision, not a failure: the entry is rewritten when the pod
    is gone and its successor is planned. None: the pod stays as it is."""
    if pod.terminal:
        return None
    if recreating(pod, before):
        message = str(before.get("message") or "")
    else:
        gone = lifted(ctx, pod)
        if not gone or pod.terminating or pod.phase != PodPhase.PENDING or pod.node is not None:
            return None
        them = "it" if len(gone) == 1 else "them"
        message = f"kept off {', '.join(gone)}, no longer avoided: created again without {them}"
        ctx.event("Normal", Reason.AVOIDANCE_LIFTED, f"pod {pod.name} (index {index}): {message}")
    ctx.delete_pods([pod])
    return {
        "index": index,
        "pod": pod.name,
        "phase": RankPhase.CREATING,
        "reason": Reason.AVOIDANCE_LIFTED,
        "message": message,
    }
