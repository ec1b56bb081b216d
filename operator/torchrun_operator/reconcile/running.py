"""The current attempt: starting its gang (once the pods of earlier attempts are gone and any
back-off has passed), and observing its pods: status.ranks and status.nodes, success, the
phase and the start-up conditions. What happens when pods fail or hang is decided by the
policies in reconcile/failure/; the Scheduled condition is gang.py's, the progress and
Straggler condition training.py's."""

from __future__ import annotations

from typing import Any

from ..api import names
from ..api.status_names import ConditionType, Phase, PodPhase, RankPhase, Reason
from ..api.timefmt import seconds
from ..render import render_pod
from . import attempts, failure, gang, hang
from . import conditions as cond
from .context import Ctx, Seen, counts, entries
from .failure import avoid
from .failure.avoid import nodes as avoided_nodes
from .failure.replace import replacement_of, superseded
from .finish import finish
from .observe import PodView, rank_entry
from .rootcause import lost_candidate, pod_candidates
from .training import record_progress, record_stragglers


def start_attempt(ctx: Ctx) -> None:
    """Start the gang of the current attempt once no pod of an earlier one exists (their
    hostnames are the same) and any back-off has passed."""
    st, attempt = ctx.status, ctx.attempt
    stale = [p for p in ctx.pods if p.attempt != attempt]
    if any(p.attempt == attempt for p in ctx.pods):
        # Created before the operator could record it (e.g. it restarted): carry on.
        _begin(ctx, created=0)
        observe(ctx)
        return
    ctx.delete_pods(stale)
    due = ctx.now
    if ctx.phase == Phase.RESTARTING:
        last = seconds(st.get("lastRestartTime")) or ctx.now
        due = last + failure.backoff(ctx.spec, ctx.counters["restarts"])
    if ctx.now < due:
        ctx.requeue.append(due - ctx.now)
    if stale or ctx.now < due:
        st["nodes"] = counts(ctx.spec.nodes)
        return  # pod deletions and the back-off timer trigger the next reconcile
    ranks = []
    for i in range(ctx.spec.nodes):
        pod = render_pod(ctx.job, i, attempt, avoid_nodes=avoided_nodes(ctx))
        ctx.create_pod(pod)
        ranks.append({"index": i, "pod": pod["metadata"]["name"], "phase": RankPhase.CREATING})
    st["ranks"] = ranks
    st.pop("progress", None)
    _begin(ctx, created=len(ctx.create))


def _begin(ctx: Ctx, created: int) -> None:
    st = ctx.status
    ctx.set_phase(Phase.STARTING)
    attempts.record(ctx)
    st.setdefault("startTime", ctx.stamp)
    st["nodes"] = counts(ctx.spec.nodes)
    attempt = ctx.attempt
    ctx.set_cond(
        ConditionType.CREATED, True, Reason.PODS_CREATED, f"pods of attempt {attempt} created"
    )
    waiting = "waiting for every pod to join rendezvous"
    ctx.set_cond(ConditionType.RENDEZVOUS_DONE, False, Reason.WAITING, waiting)
    if cond.get(ctx.conds, ConditionType.RESTARTING):
        started = f"attempt {attempt} started"
        ctx.set_cond(ConditionType.RESTARTING, False, Reason.STARTED, started)
    if created:
        ctx.event("Normal", Reason.PODS_CREATED, f"Created {created} pods for attempt {attempt}")
        if ctx.spec.run_policy.active_deadline_seconds:
            ctx.requeue.append(float(ctx.spec.run_policy.active_deadline_seconds))


def observe(ctx: Ctx) -> None:
    st, attempt, desired = ctx.status, ctx.attempt, ctx.spec.nodes
    # A pod of an earlier attempt that turns up now (a late create) shares its hostname, and
    # so its DNS name, with the current pod of its index: it goes whenever it is seen.
    ctx.delete_pods(attempts.stale_pods(ctx.pods, attempt))
    ctx.delete_pods(superseded(ctx))
    by_name = {p.name: p for p in ctx.pods if p.attempt == attempt}
    old = {r.get("index"): r for r in entries(st)}
    seen = Seen()
    ranks: list[dict[str, Any]] = []
    for i in range(desired):
        before = old.get(i) or {}
        pod_name = before.get("pod") or names.pod_name(ctx.name, i, attempt)
        pod = by_name.get(pod_name)
        seen.slots[i] = (pod_name, pod)
        if pod is None:
            if before.get("phase") in (None, RankPhase.CREATING):
                # Planned but not seen yet (or never planned): (re)create, 409 is fine.
                r = replacement_of(ctx, i, pod_name)
                ctx.create_pod(render_pod(ctx.job, i, attempt, r, avoided_nodes(ctx)))
                ranks.append({"index": i, "pod": pod_name, "phase": RankPhase.CREATING})
                seen.alive.add(i)
            else:
                gone = {
                    **before,
                    "phase": RankPhase.DELETED,
                    "ready": False,
                    "reason": Reason.POD_DELETED,
                }
                gone.setdefault("failureObservedAt", ctx.stamp)
                ranks.append(gone)
                seen.failed.add(i)
                seen.candidates.append(
                    lost_candidate(i, pod_name, before.get("node"), Reason.POD_DELETED, ctx.now)
                )
            continue
        again = avoid.recreate(ctx, i, pod, before)
        if again is not None:
            # Going, to be created again under its name: the slot waits for that pod.
            seen.slots[i] = (pod_name, None)
            seen.recreated.add(i)
            seen.alive.add(i)
            ranks.append(again)
            continue
        seen.current[i] = pod
        entry = rank_entry(i, pod, ctx.live.get(pod.uid or ""), before)
        if hang.started_now(pod, before):
            seen.started_now.add(i)
        entry.update(hang.observed(pod, before, ctx.now))  # the hang timers' clock
        ranks.append(entry)
        _classify_pod(ctx, i, pod, seen)
        if i in seen.failed:
            same_pod = before.get("pod") == pod.name
            entry["failureObservedAt"] = (same_pod and before.get("failureObservedAt")) or ctx.stamp
    st["ranks"] = ranks
    # Elastic scale-down (spec.nodes lowered): pods beyond the desired count go.
    ctx.delete_pods([p for p in by_name.values() if (p.node_index or 0) >= desired])
    st["nodes"] = counts(desired, list(seen.current.values()), len(seen.failed))
    record_progress(ctx, seen)

    if seen.failed:
        failure.on_failures(ctx, seen)
        _start_if_restarting(ctx)
        return
    if _succeeded(ctx, seen):
        return
    joined = _past_rendezvous(ctx, seen)
    if failure.hung(ctx, seen, joined):
        _start_if_restarting(ctx)
        return
    all_up = all(
        i in seen.current and seen.current[i].phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED)
        for i in range(desired)
    )
    waiting = gang.scheduling(ctx, seen)
    ctx.set_phase(Phase.RUNNING if all_up else Phase.WAITING if waiting else Phase.STARTING)
    record_stragglers(ctx, seen)
    running = f"{desired} pods running"
    if all_up and ctx.set_cond(ConditionType.RUNNING, True, Reason.ALL_PODS_RUNNING, running):
        ctx.reached(ConditionType.RUNNING)
    joined_msg = f"all {desired} pods joined rendezvous"
    if joined and ctx.set_cond(
        ConditionType.RENDEZVOUS_DONE, True, Reason.ALL_PODS_READY, joined_msg
    ):
        ctx.reached(ConditionType.RENDEZVOUS_DONE)
        ctx.event(
            "Normal",
            Reason.RENDEZVOUS_DONE,
            f"All {desired} pods joined rendezvous (attempt {attempt})",
        )


def _past_rendezvous(ctx: Ctx, seen: Seen) -> bool:
    """Whether the rendezvous round of the attempt completed: every pod is Ready, or its
    launcher answers that it knows its node rank (podinput.rendezvoused); without elastic
    bounds one such pod is enough, as a round then holds every pod. Readiness of all at once
    is not needed: an operator away while the pods were all Ready (down, deposed, or the
    apiserver) may first see them with one already quiet, and must not judge that stall a
    rendezvous hang."""
    past = 0
    for i in range(ctx.spec.nodes):
        pod = seen.current.get(i)
        if pod is None:
            return False
        live = ctx.live.get(pod.uid or "")
        past += pod.ready or (live is not None and live.rendezvoused)
    return past == ctx.spec.nodes or (past > 0 and not ctx.spec.is_elastic)


def _start_if_restarting(ctx: Ctx) -> None:
    """A failure policy decided a gang restart: start the next attempt now if nothing is
    left to wait for (old pods to go, the back-off)."""
    if ctx.phase == Phase.RESTARTING:
        start_attempt(ctx)


def _classify_pod(ctx: Ctx, i: int, pod: PodView, seen: Seen) -> None:
    if pod.phase == PodPhase.SUCCEEDED:
        seen.succeeded.add(i)
    elif pod.phase == PodPhase.FAILED:
        seen.failed.add(i)
        seen.candidates.extend(pod_candidates(i, pod, seconds(pod.finished_at), ctx.now))
    elif pod.terminating or pod.phase == PodPhase.UNKNOWN:
        # Deleted by someone else, evicted, preempted, or its node is gone.
        lost = Reason.POD_DELETED if pod.terminating else Reason.NODE_LOST
        reason = pod.disruption or lost
        at = seconds(pod.deletion_time) if pod.terminating else None
        seen.failed.add(i)
        seen.candidates.append(lost_candidate(i, pod.name, pod.node, reason, at or ctx.now))
    else:
        seen.alive.add(i)


def _succeeded(ctx: Ctx, seen: Seen) -> bool:
    desired = ctx.spec.nodes
    if ctx.spec.success_policy == "RankZero":
        zero = next((i for i, p in seen.current.items() if 0 in p.global_ranks), None)
        if zero is not None and zero in seen.succeeded:
            pod = seen.current[zero].name
            message = f"global rank 0 (pod {pod}) succeeded"
            finish(ctx, Phase.SUCCEEDED, Reason.RANK_ZERO_SUCCEEDED, message)
            return True
    if len(seen.succeeded) == desired:
        message = f"all {desired} pods succeeded"
        finish(ctx, Phase.SUCCEEDED, Reason.ALL_RANKS_SUCCEEDED, message)
        return True
    return False
