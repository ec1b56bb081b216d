"""Elastic replacement: an elastic job that lost pods to the infrastructure, with enough left
to train on, replaces only those pods (new names, same hostnames, same attempt)."""

from __future__ import annotations

from ...api import names
from ...api.status_names import Phase, RankPhase, Reason, RestartKind
from ...render import render_pod
from .. import crashloop
from ..context import Ctx, Seen, entries
from ..observe import PodView
from ..rootcause import Candidate, classify
from . import avoid
from .cause import failure_record, record_failure
from .restart import budget_spent, fail_spent


def applies(ctx: Ctx, seen: Seen) -> bool:
    """Whether the attempt goes on with replacements instead of a gang restart: the job is
    elastic, the rendezvous host (index 0) lives, enough pods are alive, and every failure
    is the infrastructure's."""
    spec = ctx.spec
    retryable = spec.failure_policy.retryable_exit_codes
    return (
        spec.is_elastic
        and 0 not in seen.failed
        and len(seen.alive) >= spec.min_nodes
        and all(classify(c, retryable) == "infrastructure" for c in seen.candidates)
    )


def replacement_of(ctx: Ctx, node_index: int, pod: str) -> int:
    """Which replacement of its index `pod` is (0: the attempt's first pod)."""
    for r in range(ctx.spec.failure_policy.max_restarts + 2):
        if names.pod_name(ctx.name, node_index, ctx.attempt, r) == pod:
            return r
    return 0


def superseded(ctx: Ctx) -> list[PodView]:
    """The pods of the current attempt a replacement took the place of. A replacement has the
    hostname and rendezvous id of the pod it replaced, and one lost with its node (phase
    Unknown: its kubelet stopped reporting) runs on when that kubelet comes back: beside its
    replacement, answering the same DNS name. status.ranks names the replacement (written
    before it was created), so the pod it replaced goes whenever it is seen. Only one that can
    still run (a pod that ended stays, for cleanPodPolicy to keep or remove) and only an
    earlier replacement of its index than the one the status names: never a later one."""
    named = {int(r["index"]): str(r.get("pod") or "") for r in entries(ctx.status)}
    out = []
    for p in ctx.pods:
        i = p.node_index
        if p.terminal or p.attempt != ctx.attempt or i is None or i not in named:
            continue
        if p.name == named[i]:
            continue
        if replacement_of(ctx, i, p.name) < replacement_of(ctx, i, named[i]):
            out.append(p)
    return out


def replace(ctx: Ctx, seen: Seen, cause: Candidate) -> None:
    """Replace the failed pods, each spending one restart; fail the job if they would
    overspend the budget."""
    counters, st = ctx.counters, ctx.status
    step = crashloop.attempt_step(st.get("ranks") or [])
    if budget_spent(ctx, len(seen.failed)):
        record_failure(ctx, cause, step)
        counters["infrastructureFailures"] += 1
        fail_spent(ctx, cause)
        return
    st["failure"] = failure_record(cause, step)
    by_index = {c.node_index: c for c in seen.candidates}
    # Before the replacements are rendered: they keep off the nodes that failed them (any
    # failure of a pod may be the one that blames its node; each node once).
    blamed: set[str] = set()
    for c in seen.candidates:
        node = avoid.blamed_node(c)
        if c.node_index in seen.failed and node is not None and node not in blamed:
            blamed.add(node)
            avoid.avoid(ctx, c)
    for i in sorted(seen.failed):
        old = st["ranks"][i]["pod"]
        # Derived from the status alone (the pod it replaces), never "the next free name":
        # a retry after a lost write must plan the very same pod.
        r = replacement_of(ctx, i, old) + 1
        pod = render_pod(ctx.job, i, ctx.attempt, r, avoid.nodes(ctx))
        new = pod["metadata"]["name"]
        ctx.create_pod(pod)
        st["ranks"][i] = {"index": i, "pod": new, "phase": RankPhase.CREATING}
        counters["infrastructureFailures"] += 1
        why = by_index[i]
        ctx.record_restart(
            {
                "reason": why.reason,
                "rank": why.rank,
                "index": i,
                "nodeRank": why.node_rank,
                "kind": RestartKind.REPLACEMENT,
            },
        )
        ctx.event(
            "Warning",
            Reason.POD_REPLACED,
            f"index {i}: pod {old} {why.reason}; replaced by {new}",
        )
    # The replacement starts Pending and the survivors re-rendezvous with it: the job is
    # Starting from this decision on, as the next reconcile would derive from the new pod
    # (said here, once, not discovered on the next read).
    ctx.set_phase(Phase.STARTING)
