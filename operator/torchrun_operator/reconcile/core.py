"""reconcile(job, pods, now) -> Plan: the operator's decisions as one pure function.

Level-triggered: everything is derived from the job (spec and the status we wrote last
time, which is the operator's only memory), the pods observed now, and what their launchers'
status endpoints said when last read (`live`: the rank map and progress of running pods).
Calling it again with the same inputs plans the same creates and deletes (which the shell
treats as idempotent), and no events or transitions: those come only where the status changes.

This module starts, suspends and observes attempts; what happens when pods fail or hang is
decided by the policies in reconcile/failure/, and the job's end in finish.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..api import names
from ..api.models import JobSpec, RunPolicy
from ..api.runtimemerge import explain
from ..api.status_names import (
    FINISHED,
    ConditionType,
    Phase,
    PodPhase,
    RankPhase,
    Reason,
    RestartKind,
)
from ..api.timefmt import seconds
from ..render import render_pod, world_size
from . import attempts, crashloop, failure, gang, hang
from . import conditions as cond
from . import progress as prog
from .admission import Admission
from .context import MAX_REQUEUE_SECONDS, Ctx, Seen, counts, entries, renamed
from .failure import SETTLE_SECONDS
from .failure.avoid import nodes as avoided_nodes
from .failure.avoid import prune as avoid_prune
from .failure.replace import replacement_of
from .finish import after_finish, finish
from .observe import Live, PodView, parse_live, rank_entry, truncate, view
from .plan import Plan
from .queueing import admitted, queue, record_admission
from .refused import say_refused
from .rootcause import lost_candidate, pod_candidates
from .runtimeref import RUNTIME_RETRY_SECONDS, Resolved

# The reconciler's timing constants are read from here (tests/unit/reconcile).
__all__ = ["MAX_REQUEUE_SECONDS", "SETTLE_SECONDS", "reconcile"]


def reconcile(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    now: datetime,
    blocked: Sequence[str] = (),
    refused: Sequence[str] = (),
    live: Mapping[str, Any] | None = None,
    admission: Admission | None = None,
    view_of: Callable[[dict[str, Any], str | None], PodView] = view,
    runtime: Resolved | None = None,
) -> Plan:
    """`blocked`: objects the shell found in the job's way (a Service or ConfigMap under the
    job's names that is not the job's), described for people; while any is, no pod is
    created and the Blocked condition says why. `refused`: the apiserver's answers to pod
    creates it refused (Pod Security, a quota, a webhook), which the shell retries with
    back-off; the Blocked condition carries them meanwhile. `live`: per pod uid, the latest
    answer of the pod's launcher status endpoint as the shell read it, {"at": unix seconds
    on the operator's clock, "data": the JSON} (docs/pod-contract.md); answers that do not
    belong to the pod's attempt and index are ignored. `admission`: what Kueue says about a
    job queued through it (reconcile/admission.py), None for any other job. `view_of`: how a
    pod is read (observe.view; the shell passes one that remembers the views of the pods it
    has cached, which never change). `runtime`: what the job's spec.runtimeRef resolved to
    (reconcile/runtimeref.py), whose `job` is the one passed here; None for a job without one."""
    status = _migrated(json_copy(job.get("status") or {}))
    meta = job["metadata"]
    if meta.get("generation") is not None:
        status["observedGeneration"] = meta["generation"]
    status.setdefault("attempt", 0)
    status.setdefault("phase", Phase.PENDING)
    if runtime is not None and runtime.missing:
        return _await_runtime(job, pods, status, now, str(runtime.runtime), view_of)
    problem = runtime.problem if runtime is not None else None
    try:
        spec = JobSpec.model_validate(job.get("spec") or {})
    except ValidationError as err:
        if runtime is not None and runtime.own_spec is not None:
            problem = problem or explain(err, job["spec"], runtime.own_spec, str(runtime.runtime))
        else:
            problem = problem or f"invalid spec: {err}"
    if problem is not None:
        return _invalid(job, pods, status, now, problem, view_of)
    views = [view_of(p, spec.trainer.name) for p in pods]
    uid = meta.get("uid")
    reads: dict[str, Live] = {}
    for v in views:
        if v.uid and live and v.uid in live and v.attempt is not None:
            parsed = parse_live(live[v.uid], names.rdzv_id(str(uid), v.attempt), v.node_index)
            if parsed is not None:
                reads[v.uid] = parsed
    ctx = Ctx(
        job=job,
        spec=spec,
        now=now.timestamp(),
        status=status,
        # Ownership is by controller uid alone: a pod with the job's labels but another
        # owner (or none) is never taken for the job's own, nor deleted.
        pods=[v for v in views if v.owner_uid == meta.get("uid")],
        taken={v.name for v in views},
        foreign={v.name for v in views if v.owner_uid != meta.get("uid")},
        blocked=list(blocked),
        refused=list(refused),
        live=reads,
    )
    ctx.counters  # noqa: B018 - materialise the counters so every status carries them
    status["worldSize"] = world_size(spec)
    if runtime is not None and runtime.resolved_now:
        rec = status["runtime"]
        message = f"{runtime.runtime} resolved (resourceVersion {rec.get('resourceVersion')})"
        ctx.set_cond(ConditionType.RUNTIME_RESOLVED, True, Reason.RUNTIME_RESOLVED, message)
        ctx.event("Normal", Reason.RUNTIME_RESOLVED, message)

    phase = status["phase"]
    waited = record_admission(ctx, admission) if phase not in FINISHED else None
    if phase in FINISHED:
        after_finish(ctx)
    elif spec.run_policy.suspend:
        _suspend(ctx)
    elif admission is not None and not admission.admitted:
        queue(ctx, admission)
    else:
        if phase == Phase.SUSPENDED:
            _resume(ctx)
        elif phase == Phase.QUEUED:
            admitted(ctx, waited)
        avoid_prune(ctx)
        if not _deadline_passed(ctx):
            attempts.follow_spec(ctx)
            if ctx.phase in (Phase.PENDING, Phase.RESTARTING):
                before = json_copy(ctx.status)
                decided = len(ctx.transitions)
                _start_attempt(ctx)
                if ctx.blocked:
                    # Nothing starts while something is in the way: the job stays as it was
                    # (Pending, or Restarting) and the Blocked condition says why.
                    ctx.status.clear()
                    ctx.status.update(before)
                    ctx.events.clear()
                    del ctx.transitions[decided:]
            else:
                _observe(ctx)
        gang.record(ctx.status, spec, ctx.name)
        _report_blocked(ctx)
    say_refused(ctx, live)
    return ctx.plan()


def _report_blocked(ctx: Ctx) -> None:
    if ctx.blocked or ctx.refused:
        reason = Reason.OBJECT_IN_THE_WAY if ctx.blocked else Reason.POD_CREATE_REFUSED
        message = truncate("; ".join(sorted({*ctx.blocked, *ctx.refused}))) or ""
        old = cond.get(ctx.conds, ConditionType.BLOCKED) or {}
        flipped = ctx.set_cond(ConditionType.BLOCKED, True, reason, message)
        if flipped or old.get("reason") != reason:
            ctx.event("Warning", reason, message)
    elif cond.is_true(ctx.conds, ConditionType.BLOCKED):
        message = "nothing stands in the job's way"
        ctx.set_cond(ConditionType.BLOCKED, False, Reason.UNBLOCKED, message)


def _invalid(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    status: dict[str, Any],
    now: datetime,
    problem: str,
    view_of: Callable[[dict[str, Any], str | None], PodView],
) -> Plan:
    """A spec the model refuses fails the job like any other failure (finish.py): its pods
    go per cleanPodPolicy and its TTL applies, now and on every later reconcile. The end
    reads the spec's runPolicy alone, so the spec built here carries only that, validated;
    a runPolicy that is itself invalid ends the job by the defaults."""
    raw = job.get("spec") or {}
    spec = JobSpec.model_construct(run_policy=_run_policy(raw.get("runPolicy")))
    uid = job["metadata"].get("uid")
    views = [view_of(p, _trainer_name(raw)) for p in pods]
    ctx = Ctx(
        job=job,
        spec=spec,
        now=now.timestamp(),
        status=status,
        pods=[v for v in views if v.owner_uid == uid],  # ownership by controller uid alone
        taken={v.name for v in views},
    )
    if ctx.phase in FINISHED:
        after_finish(ctx)
    else:
        finish(ctx, Phase.FAILED, Reason.INVALID_SPEC, truncate(problem) or "")
    return ctx.plan()


def _await_runtime(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    status: dict[str, Any],
    now: datetime,
    runtime: str,
    view_of: Callable[[dict[str, Any], str | None], PodView],
) -> Plan:
    """The job's runtime does not exist (yet): it stays Pending, creates nothing, and says
    which runtime it waits for; the shell reads the runtime again after
    RUNTIME_RETRY_SECONDS."""
    raw = job.get("spec") or {}
    uid = job["metadata"].get("uid")
    views = [view_of(p, _trainer_name(raw)) for p in pods]
    ctx = Ctx(
        job=job,
        spec=JobSpec.model_construct(run_policy=_run_policy(raw.get("runPolicy"))),
        now=now.timestamp(),
        status=status,
        pods=[v for v in views if v.owner_uid == uid],
        taken={v.name for v in views},
    )
    message = f"{runtime} (spec.runtimeRef) not found; the job starts once it exists"
    if ctx.set_cond(ConditionType.RUNTIME_RESOLVED, False, Reason.RUNTIME_NOT_FOUND, message):
        ctx.event("Warning", Reason.RUNTIME_NOT_FOUND, message)
    ctx.requeue.append(RUNTIME_RETRY_SECONDS)
    return ctx.plan()


def _run_policy(raw: Any) -> RunPolicy:
    try:
        return RunPolicy.model_validate(raw or {})
    except ValidationError:
        return RunPolicy()


def _trainer_name(raw: Mapping[str, Any]) -> str | None:
    """The first container's name in an unvalidated spec, if it has one."""
    try:
        name = raw["template"]["spec"]["containers"][0]["name"]
    except (KeyError, IndexError, TypeError):
        return None
    return name if isinstance(name, str) else None


# ---- suspend, deadline --------------------------------------------------------------------


def _suspend(ctx: Ctx) -> None:
    ctx.delete_pods(ctx.pods)
    if ctx.phase != Phase.SUSPENDED:
        ctx.set_phase(Phase.SUSPENDED)
        message = "runPolicy.suspend is true; pods deleted"
        ctx.set_cond(ConditionType.SUSPENDED, True, Reason.SUSPENDED, message)
        ctx.set_cond(ConditionType.RUNNING, False, Reason.SUSPENDED, "job is suspended")
        ctx.event("Normal", Reason.SUSPENDED, f"Job suspended; deleting {len(ctx.delete)} pods")
    desired = ctx.spec.nodes
    ctx.status["nodes"] = counts(desired)


def _resume(ctx: Ctx) -> None:
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


def _deadline_passed(ctx: Ctx) -> bool:
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


# ---- attempts -----------------------------------------------------------------------------


def _start_attempt(ctx: Ctx) -> None:
    """Start the gang of the current attempt once no pod of an earlier one exists (their
    hostnames are the same) and any back-off has passed."""
    st, attempt = ctx.status, ctx.attempt
    stale = [p for p in ctx.pods if p.attempt != attempt]
    if any(p.attempt == attempt for p in ctx.pods):
        # Created before the operator could record it (e.g. it restarted): carry on.
        _begin(ctx, created=0)
        _observe(ctx)
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


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON document (dicts, lists, scalars): copy.deepcopy's memo and
    dispatch made it a tenth of a big job's reconcile, copying a 512-entry status."""
    if type(value) is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [json_copy(v) for v in value]
    return value


def _migrated(status: dict[str, Any]) -> dict[str, Any]:
    """A status written before the pod index had its own field: its `nodeRank`s (in ranks,
    the failure and the restart records) were pod indexes, and become `index`."""

    for key in ("ranks", "restarts"):
        if isinstance(status.get(key), list):
            status[key] = [renamed(r) for r in status[key]]
    if isinstance(status.get("failure"), dict):
        status["failure"] = renamed(status["failure"])
    return status


# ---- observing a running attempt ----------------------------------------------------------


def _observe(ctx: Ctx) -> None:
    st, attempt, desired = ctx.status, ctx.attempt, ctx.spec.nodes
    # A pod of an earlier attempt that turns up now (a late create) shares its hostname, and
    # so its DNS name, with the current pod of its index: it goes whenever it is seen.
    ctx.delete_pods(attempts.stale_pods(ctx.pods, attempt))
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
        seen.current[i] = pod
        entry = rank_entry(i, pod, ctx.live.get(pod.uid or ""), before)
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
    _progress(ctx, seen)

    if seen.failed:
        failure.on_failures(ctx, seen)
        _start_if_restarting(ctx)
        return
    if _succeeded(ctx, seen):
        return
    if failure.hung(ctx, seen):
        _start_if_restarting(ctx)
        return
    all_up = all(
        i in seen.current and seen.current[i].phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED)
        for i in range(desired)
    )
    waiting = _scheduling(ctx, seen)
    ctx.set_phase(Phase.RUNNING if all_up else Phase.WAITING if waiting else Phase.STARTING)
    _stragglers(ctx, seen)
    running = f"{desired} pods running"
    if all_up and ctx.set_cond(ConditionType.RUNNING, True, Reason.ALL_PODS_RUNNING, running):
        ctx.reached(ConditionType.RUNNING)
    ready = sum(1 for p in seen.current.values() if p.ready)
    joined = f"all {desired} pods joined rendezvous"
    if ready == desired and ctx.set_cond(
        ConditionType.RENDEZVOUS_DONE, True, Reason.ALL_PODS_READY, joined
    ):
        ctx.reached(ConditionType.RENDEZVOUS_DONE)
        ctx.event(
            "Normal",
            Reason.RENDEZVOUS_DONE,
            f"All {desired} pods joined rendezvous (attempt {attempt})",
        )


def _start_if_restarting(ctx: Ctx) -> None:
    """A failure policy decided a gang restart: start the next attempt now if nothing is
    left to wait for (old pods to go, the back-off)."""
    if ctx.phase == Phase.RESTARTING:
        _start_attempt(ctx)


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


def _scheduling(ctx: Ctx, seen: Seen) -> bool:
    """The Scheduled condition, False while the scheduler says it cannot place pods (a gang
    that does not fit, a topology domain, resources); it appears only once a pod had to wait.
    True while the job waits so (its phase is then Waiting)."""
    desired = ctx.spec.nodes
    why = gang.waiting(seen.current, desired, ctx.spec, ctx.status)
    if why is not None:
        if ctx.set_cond(ConditionType.SCHEDULED, False, *why):
            ctx.event("Normal", Reason.WAITING, why[1])
    elif cond.get(ctx.conds, ConditionType.SCHEDULED) and gang.scheduled(seen.current, desired):
        message = f"all {desired} pods scheduled"
        ctx.set_cond(ConditionType.SCHEDULED, True, Reason.ALL_PODS_SCHEDULED, message)
    return why is not None


# ---- progress -----------------------------------------------------------------------------


def _live_by_index(ctx: Ctx, seen: Seen) -> dict[int, Live]:
    out = {}
    for i, pod in seen.current.items():
        lv = ctx.live.get(pod.uid or "")
        if lv is not None and not pod.terminal:
            out[i] = lv
    return out


def _progress(ctx: Ctx, seen: Seen) -> None:
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
    else:
        found[crashloop.START_STEP] = crashloop.start_step(before, found["step"])
        st["progress"] = found


def _stragglers(ctx: Ctx, seen: Seen) -> None:
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
