"""reconcile(job, pods, now) -> Plan: the operator's decisions as one pure function.

Level-triggered: everything is derived from the job (spec and the status we wrote last
time, which is the operator's only memory), the pods observed now, and what their launchers'
status endpoints said when last read (`live`: the rank map and progress of running pods).
Calling it again with the same inputs plans the same creates and deletes (which the shell
treats as idempotent), and no events: events are emitted only where the status changes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from ..api import names
from ..api.models import JobSpec
from ..render import render_pod, world_size
from . import budget, crashloop, gang, hang
from . import conditions as cond
from . import progress as prog
from .observe import Live, PodView, parse_live, rank_entry, truncate, view
from .plan import Event, Plan
from .rootcause import WINDOW, Candidate, classify, lost_candidate, pod_candidates, root_cause
from .timefmt import fmt, seconds

FINISHED = ("Succeeded", "Failed")
MAX_RESTART_RECORDS = 10
# A failure that restarting may fix is acted on only once the other nodes have had time to
# report, or have all stopped: their reports may hold the exception that really caused it.
SETTLE_SECONDS = 2 * WINDOW
# How long before the operator sees a pod's failure it can have happened, on the operator's
# clock (the agent's report, the kubelet's status sync, the watch). Node-reported times are
# clamped to it; with the 1 s of whole-second stamps it stays inside the root-cause WINDOW.
REPORT_LAG = 2.0
# The longest the shell is asked to wait before looking again. Deadlines and TTLs of any
# length then cost a wake-up an hour, and no delay can overflow a timer.
MAX_REQUEUE_SECONDS = 3600.0
# How soon a job that something is blocking looks again.
BLOCKED_REQUEUE_SECONDS = 5.0


@dataclass
class _Ctx:
    job: dict[str, Any]
    spec: JobSpec
    now: float
    status: dict[str, Any]
    pods: list[PodView]  # ours (controller uid matches), any attempt
    taken: set[str]  # every observed pod name, ours or not: never create over one
    foreign: set[str] = field(default_factory=set)  # observed pod names that are not ours
    blocked: list[str] = field(default_factory=list)  # what stands in the way, for people
    refused: list[str] = field(default_factory=list)  # pod creates the apiserver refused
    live: dict[str, Live] = field(default_factory=dict)  # pod uid -> its launcher's status
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue: list[float] = field(default_factory=list)
    delete_job: bool = False

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def stamp(self) -> str:
        return fmt(self.now)

    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt") or 0)

    @property
    def conds(self) -> list[dict[str, Any]]:
        return self.status.setdefault("conditions", [])

    @property
    def counters(self) -> dict[str, int]:
        c = self.status.setdefault("counters", {})
        for key in ("userFailures", "infrastructureFailures", "restarts"):
            c.setdefault(key, 0)
        return c

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def set_cond(self, type_: str, status: bool, reason: str, message: str) -> bool:
        return cond.set_condition(self.conds, type_, status, reason, message, self.stamp)

    def create_pod(self, pod: dict[str, Any]) -> None:
        """Plan a create unless the name is taken; a name taken by a pod that is not ours
        blocks the job (it is never deleted: it is not ours)."""
        name = pod["metadata"]["name"]
        if name in self.foreign:
            ns = self.job["metadata"].get("namespace")
            self.blocked.append(
                f"Pod {ns}/{name} exists and is not this job's; delete or rename it"
            )
        elif name not in self.taken:
            self.create.append(pod)

    def delete_pods(self, pods: list[PodView]) -> None:
        self.delete.extend(p.name for p in pods if not p.terminating and p.name not in self.delete)

    def plan(self) -> Plan:
        positive = [r for r in self.requeue if r is not None and r == r]  # r == r: not NaN
        if self.blocked:
            positive.append(BLOCKED_REQUEUE_SECONDS)
        return Plan(
            create=[] if self.blocked else self.create,
            delete=self.delete,
            status=budget.bound(self.status),
            events=self.events,
            requeue_after=min(max(0.0, min(positive)), MAX_REQUEUE_SECONDS) if positive else None,
            delete_job=self.delete_job,
        )


def reconcile(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    now: datetime,
    blocked: Sequence[str] = (),
    refused: Sequence[str] = (),
    live: Mapping[str, Any] | None = None,
) -> Plan:
    """`blocked`: objects the shell found in the job's way (a Service or ConfigMap under the
    job's names that is not the job's), described for people; while any is, no pod is
    created and the Blocked condition says why. `refused`: the apiserver's answers to pod
    creates it refused (Pod Security, a quota, a webhook), which the shell retries with
    back-off; the Blocked condition carries them meanwhile. `live`: per pod uid, the latest
    answer of the pod's launcher status endpoint as the shell read it, {"at": unix seconds
    on the operator's clock, "data": the JSON} (docs/pod-contract.md); answers that do not
    belong to the pod's attempt and index are ignored."""
    status = _migrated(copy.deepcopy(job.get("status") or {}))
    meta = job["metadata"]
    if meta.get("generation") is not None:
        status["observedGeneration"] = meta["generation"]
    status.setdefault("attempt", 0)
    status.setdefault("phase", "Pending")
    try:
        spec = JobSpec.model_validate(job.get("spec") or {})
    except ValidationError as err:
        return _invalid(job, status, now, err)
    views = [view(p, spec.trainer.name) for p in pods]
    uid = meta.get("uid")
    reads: dict[str, Live] = {}
    for v in views:
        if v.uid and live and v.uid in live and v.attempt is not None:
            parsed = parse_live(live[v.uid], names.rdzv_id(str(uid), v.attempt), v.node_index)
            if parsed is not None:
                reads[v.uid] = parsed
    ctx = _Ctx(
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

    phase = status["phase"]
    if phase in FINISHED:
        _after_finish(ctx)
    elif spec.run_policy.suspend:
        _suspend(ctx)
    else:
        if phase == "Suspended":
            _resume(ctx)
        if not _deadline_passed(ctx):
            if ctx.status["phase"] in ("Pending", "Restarting"):
                before = copy.deepcopy(ctx.status)
                _start_attempt(ctx)
                if ctx.blocked:
                    # Nothing starts while something is in the way: the job stays as it was
                    # (Pending, or Restarting) and the Blocked condition says why.
                    ctx.status.clear()
                    ctx.status.update(before)
                    ctx.events.clear()
            else:
                _observe(ctx)
        gang.record(ctx.status, spec, ctx.name)
        _report_blocked(ctx)
    return ctx.plan()


def _report_blocked(ctx: _Ctx) -> None:
    if ctx.blocked or ctx.refused:
        reason = "ObjectInTheWay" if ctx.blocked else "PodCreateRefused"
        message = truncate("; ".join(sorted({*ctx.blocked, *ctx.refused}))) or ""
        old = cond.get(ctx.conds, "Blocked") or {}
        flipped = ctx.set_cond("Blocked", True, reason, message)
        if flipped or old.get("reason") != reason:
            ctx.event("Warning", reason, message)
    elif cond.is_true(ctx.conds, "Blocked"):
        ctx.set_cond("Blocked", False, "Unblocked", "nothing stands in the job's way")


def _invalid(job: dict[str, Any], status: dict[str, Any], now: datetime, err: Exception) -> Plan:
    if status.get("phase") in FINISHED:
        return Plan(status=status)
    message = truncate(f"invalid spec: {err}") or ""
    stamp = fmt(now)
    status["phase"] = "Failed"
    status["completionTime"] = stamp
    conds = status.setdefault("conditions", [])
    cond.set_condition(conds, "Failed", True, "InvalidSpec", message, stamp)
    return Plan(status=status, events=[Event("Warning", "InvalidSpec", message)])


# ---- suspend, deadline --------------------------------------------------------------------


def _suspend(ctx: _Ctx) -> None:
    ctx.delete_pods(ctx.pods)
    if ctx.status["phase"] != "Suspended":
        ctx.status["phase"] = "Suspended"
        ctx.set_cond("Suspended", True, "Suspended", "runPolicy.suspend is true; pods deleted")
        ctx.set_cond("Running", False, "Suspended", "job is suspended")
        ctx.event("Normal", "Suspended", f"Job suspended; deleting {len(ctx.delete)} pods")
    desired = ctx.spec.nodes
    ctx.status["nodes"] = _counts(desired)


def _resume(ctx: _Ctx) -> None:
    """A resumed job starts a fresh attempt (its old rendezvous is gone) without spending
    the restart budget, and its deadline counts from now."""
    st = ctx.status
    if st.get("ranks"):
        st["attempt"] = ctx.attempt + 1
        _record_restart(ctx, {"reason": "Resumed", "kind": "suspend"})
    st["phase"] = "Pending"
    st.pop("startTime", None)
    ctx.set_cond("Suspended", False, "Resumed", "runPolicy.suspend is false")
    ctx.event("Normal", "Resumed", f"Job resumed; starting attempt {ctx.attempt}")


def _deadline_passed(ctx: _Ctx) -> bool:
    limit = ctx.spec.run_policy.active_deadline_seconds
    start = seconds(ctx.status.get("startTime"))
    if limit is None or start is None:
        return False
    left = start + limit - ctx.now
    if left > 0:
        ctx.requeue.append(left)
        return False
    _finish(ctx, "Failed", "DeadlineExceeded", f"runPolicy.activeDeadlineSeconds ({limit}s) passed")
    return True


# ---- attempts -----------------------------------------------------------------------------


def _backoff(spec: JobSpec, restarts: int) -> float:
    policy = spec.failure_policy
    raw = policy.backoff_seconds * 2 ** max(restarts - 1, 0)
    return float(min(raw, policy.max_backoff_seconds))


def _start_attempt(ctx: _Ctx) -> None:
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
    if st["phase"] == "Restarting":
        last = seconds(st.get("lastRestartTime")) or ctx.now
        due = last + _backoff(ctx.spec, ctx.counters["restarts"])
    if ctx.now < due:
        ctx.requeue.append(due - ctx.now)
    if stale or ctx.now < due:
        st["nodes"] = _counts(ctx.spec.nodes)
        return  # pod deletions and the back-off timer trigger the next reconcile
    ranks = []
    for i in range(ctx.spec.nodes):
        pod = render_pod(ctx.job, i, attempt)
        ctx.create_pod(pod)
        ranks.append({"index": i, "pod": pod["metadata"]["name"], "phase": "Creating"})
    st["ranks"] = ranks
    st.pop("progress", None)
    _begin(ctx, created=len(ctx.create))


def _begin(ctx: _Ctx, created: int) -> None:
    st = ctx.status
    st["phase"] = "Starting"
    st.setdefault("startTime", ctx.stamp)
    st["nodes"] = _counts(ctx.spec.nodes)
    ctx.set_cond("Created", True, "PodsCreated", f"pods of attempt {ctx.attempt} created")
    ctx.set_cond("RendezvousDone", False, "Waiting", "waiting for every pod to join rendezvous")
    if cond.get(ctx.conds, "Restarting"):
        ctx.set_cond("Restarting", False, "Started", f"attempt {ctx.attempt} started")
    if created:
        ctx.event("Normal", "PodsCreated", f"Created {created} pods for attempt {ctx.attempt}")
        if ctx.spec.run_policy.active_deadline_seconds:
            ctx.requeue.append(float(ctx.spec.run_policy.active_deadline_seconds))


def _migrated(status: dict[str, Any]) -> dict[str, Any]:
    """A status written before the pod index had its own field: its `nodeRank`s (in ranks,
    the failure and the restart records) were pod indexes, and become `index`."""

    for key in ("ranks", "restarts"):
        if isinstance(status.get(key), list):
            status[key] = [_renamed(r) for r in status[key]]
    if isinstance(status.get("failure"), dict):
        status["failure"] = _renamed(status["failure"])
    return status


def _renamed(record: Any) -> Any:
    if isinstance(record, dict) and "index" not in record and "nodeRank" in record:
        out = {k: v for k, v in record.items() if k != "nodeRank"}
        out["index"] = record["nodeRank"]
        return out
    return record


def _entries(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """status.ranks, each keyed by `index` (see _migrated)."""
    return [_renamed(r) for r in status.get("ranks") or []]


def _replacement_of(ctx: _Ctx, node_index: int, pod: str) -> int:
    for r in range(ctx.spec.failure_policy.max_restarts + 2):
        if names.pod_name(ctx.name, node_index, ctx.attempt, r) == pod:
            return r
    return 0


# ---- observing a running attempt ----------------------------------------------------------


@dataclass
class _Seen:
    alive: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    succeeded: set[int] = field(default_factory=set)
    candidates: list[Candidate] = field(default_factory=list)
    current: dict[int, PodView] = field(default_factory=dict)
    slots: dict[int, tuple[str, PodView | None]] = field(default_factory=dict)  # name, pod


def _observe(ctx: _Ctx) -> None:
    st, attempt, desired = ctx.status, ctx.attempt, ctx.spec.nodes
    by_name = {p.name: p for p in ctx.pods if p.attempt == attempt}
    old = {r.get("index"): r for r in _entries(st)}
    seen = _Seen()
    entries: list[dict[str, Any]] = []
    for i in range(desired):
        before = old.get(i) or {}
        pod_name = before.get("pod") or names.pod_name(ctx.name, i, attempt)
        pod = by_name.get(pod_name)
        seen.slots[i] = (pod_name, pod)
        if pod is None:
            if before.get("phase") in (None, "Creating"):
                # Planned but not seen yet (or never planned): (re)create, 409 is fine.
                ctx.create_pod(render_pod(ctx.job, i, attempt, _replacement_of(ctx, i, pod_name)))
                entries.append({"index": i, "pod": pod_name, "phase": "Creating"})
                seen.alive.add(i)
            else:
                gone = {**before, "phase": "Deleted", "ready": False, "reason": "PodDeleted"}
                gone.setdefault("failureObservedAt", ctx.stamp)
                entries.append(gone)
                seen.failed.add(i)
                seen.candidates.append(
                    lost_candidate(i, pod_name, before.get("node"), "PodDeleted", ctx.now)
                )
            continue
        seen.current[i] = pod
        entry = rank_entry(i, pod, ctx.live.get(pod.uid or ""), before)
        entries.append(entry)
        _classify_pod(ctx, i, pod, seen)
        if i in seen.failed:
            same_pod = before.get("pod") == pod.name
            entry["failureObservedAt"] = (same_pod and before.get("failureObservedAt")) or ctx.stamp
    st["ranks"] = entries
    # Elastic scale-down (spec.nodes lowered): pods beyond the desired count go.
    ctx.delete_pods([p for p in by_name.values() if (p.node_index or 0) >= desired])
    st["nodes"] = _counts(desired, list(seen.current.values()), len(seen.failed))
    _progress(ctx, seen)

    if seen.failed:
        _on_failures(ctx, seen)
        return
    if _succeeded(ctx, seen):
        return
    if _hung(ctx, seen):
        return
    all_up = all(
        i in seen.current and seen.current[i].phase in ("Running", "Succeeded")
        for i in range(desired)
    )
    st["phase"] = "Running" if all_up else "Starting"
    _scheduling(ctx, seen)
    _stragglers(ctx, seen)
    if all_up:
        ctx.set_cond("Running", True, "AllPodsRunning", f"{desired} pods running")
    ready = sum(1 for p in seen.current.values() if p.ready)
    if ready == desired and ctx.set_cond(
        "RendezvousDone", True, "AllPodsReady", f"all {desired} pods joined rendezvous"
    ):
        ctx.event(
            "Normal", "RendezvousDone", f"All {desired} pods joined rendezvous (attempt {attempt})"
        )


def _classify_pod(ctx: _Ctx, i: int, pod: PodView, seen: _Seen) -> None:
    if pod.phase == "Succeeded":
        seen.succeeded.add(i)
    elif pod.phase == "Failed":
        seen.failed.add(i)
        seen.candidates.extend(pod_candidates(i, pod, seconds(pod.finished_at), ctx.now))
    elif pod.terminating or pod.phase == "Unknown":
        # Deleted by someone else, evicted, preempted, or its node is gone.
        reason = pod.disruption or ("PodDeleted" if pod.terminating else "NodeLost")
        at = seconds(pod.deletion_time) if pod.terminating else None
        seen.failed.add(i)
        seen.candidates.append(lost_candidate(i, pod.name, pod.node, reason, at or ctx.now))
    else:
        seen.alive.add(i)


def _succeeded(ctx: _Ctx, seen: _Seen) -> bool:
    desired = ctx.spec.nodes
    if ctx.spec.success_policy == "RankZero":
        zero = next((i for i, p in seen.current.items() if 0 in p.global_ranks), None)
        if zero is not None and zero in seen.succeeded:
            pod = seen.current[zero].name
            _finish(ctx, "Succeeded", "RankZeroSucceeded", f"global rank 0 (pod {pod}) succeeded")
            return True
    if len(seen.succeeded) == desired:
        _finish(ctx, "Succeeded", "AllRanksSucceeded", f"all {desired} pods succeeded")
        return True
    return False


def _scheduling(ctx: _Ctx, seen: _Seen) -> None:
    """Waiting, and the Scheduled condition, while the scheduler says it cannot place pods
    (a gang that does not fit, a topology domain, resources); the condition appears only
    once a pod had to wait."""
    desired = ctx.spec.nodes
    why = gang.waiting(seen.current, desired, ctx.spec, ctx.status)
    if why is not None:
        ctx.status["phase"] = "Waiting"
        if ctx.set_cond("Scheduled", False, *why):
            ctx.event("Normal", "Waiting", why[1])
    elif cond.get(ctx.conds, "Scheduled") and gang.scheduled(seen.current, desired):
        ctx.set_cond("Scheduled", True, "AllPodsScheduled", f"all {desired} pods scheduled")


# ---- progress -----------------------------------------------------------------------------


def _live_by_index(ctx: _Ctx, seen: _Seen) -> dict[int, Live]:
    out = {}
    for i, pod in seen.current.items():
        lv = ctx.live.get(pod.uid or "")
        if lv is not None and not pod.terminal:
            out[i] = lv
    return out


def _progress(ctx: _Ctx, seen: _Seen) -> None:
    """status.progress of the current attempt, from its pods' steps."""
    st = ctx.status
    found = prog.job_progress(st["ranks"], _live_by_index(ctx, seen), st.get("progress"))
    if found is None:
        st.pop("progress", None)
    else:
        st["progress"] = found


def _stragglers(ctx: _Ctx, seen: _Seen) -> None:
    """The Straggler condition (spec.monitoring.straggler): the pods whose mean step time over
    the window stays above factor times the median."""
    config = ctx.spec.monitoring.straggler
    if config is None:
        # Turned off (the spec changes while suspended): no stale verdict stays behind.
        ctx.conds[:] = [c for c in ctx.conds if c.get("type") != "Straggler"]
        return
    exists = cond.get(ctx.conds, "Straggler") is not None
    if ctx.status["phase"] != "Running":
        if cond.is_true(ctx.conds, "Straggler"):
            ctx.set_cond("Straggler", False, "NotRunning", "the attempt is not running")
        return
    found = prog.stragglers(ctx.status["ranks"], _live_by_index(ctx, seen), config.factor)
    if found is None:
        if not exists:
            ctx.set_cond(
                "Straggler",
                False,
                "Measuring",
                f"waiting for {config.window_seconds}s of steps from at least two pods",
            )
        return
    slow, median = found
    if not slow:
        ctx.set_cond(
            "Straggler",
            False,
            "NoStragglers",
            f"every pod's step time is within {config.factor:g}x the median "
            f"({median:.3g}s per step over {config.window_seconds}s)",
        )
        return
    message = (
        truncate(prog.straggler_message(slow, median, config.factor, config.window_seconds)) or ""
    )
    if ctx.set_cond("Straggler", True, "SlowPods", message):
        ctx.event("Warning", "Straggler", message)


# ---- failures -----------------------------------------------------------------------------


def _failure(cause: Candidate, step: int | None = None) -> dict[str, Any]:
    out = {
        "rank": cause.rank,
        "index": cause.node_index,
        "nodeRank": cause.node_rank,
        "pod": cause.pod,
        "node": cause.node,
        "exitCode": cause.exit_code,
        "kind": cause.kind,
        "reason": cause.reason,
        "message": cause.message,
        "at": fmt(cause.at),
        "step": step,
        "location": cause.location,
    }
    return {k: v for k, v in out.items() if v is not None}


def where(pod: str, index: int, node_rank: int | None = None, node: str | None = None) -> str:
    """'pod job-1 (index 1, node rank 0, node n1)': a pod as messages name it."""
    parts = [f"index {index}"]
    if node_rank is not None:
        parts.append(f"node rank {node_rank}")
    if node:
        parts.append(f"node {node}")
    return f"pod {pod} ({', '.join(parts)})"


def _describe(cause: Candidate) -> str:
    """'rank 3 (pod job-1, index 1, node rank 0, node n1) failed: ...', or without a known
    rank 'pod job-1 (index 1, ...) failed: ...'."""
    place = where(cause.pod, cause.node_index, cause.node_rank, cause.node)
    if cause.rank is not None:
        place = f"rank {cause.rank} ({place.replace(' (', ', ', 1)}"
    code = f", exit code {cause.exit_code}" if cause.exit_code is not None else ""
    detail = f": {cause.message}" if cause.message else ""
    return truncate(f"{place} failed: {cause.reason}{code}{detail}") or ""


def _observed_at(ctx: _Ctx) -> dict[int, float]:
    """Per pod index, when the operator first saw its pod fail (its own clock)."""
    out: dict[int, float] = {}
    for entry in _entries(ctx.status):
        at = seconds(entry.get("failureObservedAt"))
        if at is not None:
            out[int(entry["index"])] = at
    return out


def _node_ranks(ctx: _Ctx) -> dict[int, int]:
    """Per pod index, torchrun's node rank as the status knows it."""
    return {
        int(e["index"]): int(e["nodeRank"])
        for e in _entries(ctx.status)
        if isinstance(e.get("nodeRank"), int) and isinstance(e.get("index"), int)
    }


def _with_node_rank(ctx: _Ctx, c: Candidate) -> Candidate:
    if c.node_rank is not None:
        return c
    return replace(c, node_rank=_node_ranks(ctx).get(c.node_index))


def _on_operator_clock(ctx: _Ctx, candidates: list[Candidate]) -> list[Candidate]:
    """Node clocks may be off by any amount. A failure happened before the operator saw it,
    and (the operator watching all along) not long before: each reported time is clamped
    into [seen - REPORT_LAG, seen + 1 s] (the status keeps whole seconds). Clamping is
    monotonic, so reports seen together keep their order; a node an hour ahead cannot
    postpone its failure, and one far behind cannot put a consequence (a lost connection)
    before its cause by more than a few seconds, within WINDOW, where an exception outranks
    it."""
    observed = _observed_at(ctx)
    out = []
    for c in candidates:
        seen = observed.get(c.node_index)
        if seen is not None:
            c = replace(c, at=min(max(c.at, seen - REPORT_LAG), seen + 1.0))
        out.append(c)
    return out


def _on_failures(ctx: _Ctx, seen: _Seen) -> None:
    spec = ctx.spec
    retryable = spec.failure_policy.retryable_exit_codes
    seen.candidates = [_with_node_rank(ctx, c) for c in _on_operator_clock(ctx, seen.candidates)]
    cause = root_cause(seen.candidates)
    klass = classify(cause, retryable)
    if (
        spec.is_elastic
        and 0 not in seen.failed
        and len(seen.alive) >= spec.min_nodes
        and all(classify(c, retryable) == "infrastructure" for c in seen.candidates)
    ):
        _replace(ctx, seen, cause)
        return
    # While other pods still run, their reports may name the real culprit: when rank 3 raises
    # on the store host, the other node's agent often dies first, of a lost store connection.
    # So wait until every pod has ended, or SETTLE_SECONDS after the first report. Lost pods
    # need no settling: nothing another node reports can explain them away.
    # Measured on the operator's clock (when it saw each failure), never a node's.
    observed = _observed_at(ctx)
    reported = [observed.get(c.node_index, c.at) for c in seen.candidates if c.kind != "lost"]
    # A rendezvous timeout is decided at once, on the pods as they are now: no training ran,
    # so no report can explain it away, and waiting lets a Pending pod start in the room the
    # failed ones freed, hiding why the rendezvous failed.
    rendezvous_timeout = cause.kind == "rendezvous" and cause.reason == "RendezvousTimeout"
    if seen.alive and reported and not rendezvous_timeout:
        settle_at = min(reported) + SETTLE_SECONDS
        if ctx.now < settle_at:
            ctx.requeue.append(settle_at - ctx.now)
            return
    if rendezvous_timeout:
        cause = _name_absentees(ctx, seen, cause)
    _fail_or_restart(ctx, cause, klass)


def _fail_or_restart(ctx: _Ctx, cause: Candidate, klass: str) -> None:
    """Record the root cause; fail on a user error, a spent budget or a crash loop, else
    gang-restart."""
    spec, counters = ctx.spec, ctx.counters
    step = crashloop.attempt_step(ctx.status.get("ranks") or [])
    ctx.status["failure"] = _failure(cause, step)
    ctx.event("Warning", "RankFailed", _describe(cause))
    if klass == "user":
        counters["userFailures"] += 1
        _finish(ctx, "Failed", cause.reason, _describe(cause))
        return
    counters["infrastructureFailures"] += 1
    signature = crashloop.signature(cause)
    if spec.failure_policy.crash_loop_detection and _crash_loop(ctx, cause, signature, step):
        return
    budget = spec.failure_policy.max_restarts
    if counters["restarts"] >= budget:
        _finish(
            ctx,
            "Failed",
            "RestartBudgetExhausted",
            truncate(
                f"failurePolicy.maxRestarts ({budget}) spent; last failure: {_describe(cause)}"
            )
            or "",
        )
        return
    _gang_restart(ctx, cause, step, signature)


def _crash_loop(ctx: _Ctx, cause: Candidate, signature: str | None, step: int | None) -> bool:
    """Fail the job (CrashLoopNoProgress) when this attempt failed like the one before it
    and got no further (reconcile/crashloop.py). True when it did."""
    before = crashloop.previous_failure(ctx.status.get("restarts") or [], ctx.attempt)
    if signature is None or before.get("signature") != signature:
        return False
    previous = before.get("step")
    previous = previous if isinstance(previous, int) and not isinstance(previous, bool) else None
    if not crashloop.made_no_progress(step, previous):
        return False
    here = "before its first step" if step is None else f"at step {step}"
    message = truncate(
        f"attempt {ctx.attempt} failed {here}, no further than attempt {ctx.attempt - 1} "
        f"(step {previous}), with the same error ({signature}); not restarting "
        f"(failurePolicy.crashLoopDetection). Last failure: {_describe(cause)}"
    )
    _finish(ctx, "Failed", "CrashLoopNoProgress", message or "")
    return True


def _name_absentees(ctx: _Ctx, seen: _Seen, cause: Candidate) -> Candidate:
    """A rendezvous timeout is caused by the pods that never arrived: name them (the first
    as the failure's pod), not the launcher that gave up waiting."""
    join = ctx.spec.rendezvous.join_timeout_seconds
    absent = hang.absentees(seen.slots, ctx.now, join)
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


def _hung(ctx: _Ctx, seen: _Seen) -> bool:
    """Hangs no launcher reports (reconcile/hang.py): a rendezvous that never completes with
    every pod Running, and (opt-in) pods that stopped reporting training progress. True when
    it failed or restarted the attempt."""
    spec = ctx.spec
    join = spec.rendezvous.join_timeout_seconds
    rdzv = cond.get(ctx.conds, "RendezvousDone")
    done = rdzv is not None and rdzv.get("status") == "True"
    pods = {i: pod for i, (_, pod) in seen.slots.items()}
    deadline = hang.rendezvous_hang_deadline(pods, done, join)
    if deadline is not None and ctx.now < deadline:
        ctx.requeue.append(deadline - ctx.now)
    elif deadline is not None:
        absent = hang.absentees(seen.slots, ctx.now, join)
        first = absent[0]  # not every pod is Ready, so someone is absent
        message = truncate(hang.rendezvous_hang_message(absent, join))
        cause = Candidate(
            first.node_index,
            first.pod,
            first.node,
            "rendezvous",
            "RendezvousTimeout",
            deadline,
            message=message,
        )
        _fail_or_restart(ctx, cause, "user")
        return True
    timeout = spec.run_policy.progress_timeout_seconds
    if timeout is None or rdzv is None or not done:
        return False
    node_ranks = _node_ranks(ctx)
    quiet = hang.quiet_pods(seen.current, seconds(rdzv.get("lastTransitionTime")), node_ranks)
    due, wait = hang.stalled(quiet, ctx.now)
    if wait is not None:
        ctx.requeue.append(wait)
    if not due:
        return False
    for q in due:
        entry = ctx.status["ranks"][q.node_index]
        entry["reason"] = "ProgressStalled"
        entry["message"] = f"no training progress for {timeout}s"
    quiet_first = due[0]
    message = hang.stall_message(due, timeout)
    cause = Candidate(
        quiet_first.node_index,
        quiet_first.pod,
        quiet_first.node,
        "stalled",
        "ProgressStalled",
        quiet_first.since,
        node_rank=quiet_first.node_rank,
    )
    culprit = hang.outside_collective(
        {i: (p.name, ctx.live.get(p.uid or "")) for i, p in seen.current.items()}
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
            node_rank=node_ranks.get(index),
            location=stack.location,
        )
    cause = replace(cause, message=truncate(message))
    _fail_or_restart(ctx, cause, classify(cause, spec.failure_policy.retryable_exit_codes))
    return True


def _record_restart(ctx: _Ctx, record: dict[str, Any]) -> None:
    entry = {"attempt": ctx.attempt, "at": ctx.stamp, **record}
    history = [
        *(ctx.status.get("restarts") or []),
        {k: v for k, v in entry.items() if v is not None},
    ]
    ctx.status["restarts"] = history[-MAX_RESTART_RECORDS:]


def _gang_restart(
    ctx: _Ctx, cause: Candidate, step: int | None = None, signature: str | None = None
) -> None:
    st, counters = ctx.status, ctx.counters
    counters["restarts"] += 1
    st["attempt"] = ctx.attempt + 1
    st["phase"] = "Restarting"
    st["lastRestartTime"] = ctx.stamp
    _record_restart(
        ctx,
        {
            "reason": cause.reason,
            "rank": cause.rank,
            "index": cause.node_index,
            "nodeRank": cause.node_rank,
            # Only infrastructure failures (a retryable exit code included) are restarted;
            # user errors fail the job.
            "kind": "infrastructure",
            # The failed attempt's: the next one is judged against them (crash loops).
            "step": step,
            "signature": signature,
        },
    )
    delay = _backoff(ctx.spec, counters["restarts"])
    message = (
        f"gang restart {counters['restarts']}/{ctx.spec.failure_policy.max_restarts}: "
        f"attempt {ctx.attempt} starts after {delay:g}s back-off"
    )
    ctx.set_cond("Restarting", True, cause.reason, message)
    ctx.set_cond("Running", False, "Restarting", message)
    ctx.set_cond("RendezvousDone", False, "Restarting", message)
    if cond.is_true(ctx.conds, "Straggler"):
        ctx.set_cond("Straggler", False, "NotRunning", message)
    ctx.event("Warning", "Restarting", message)
    st.pop("progress", None)
    _start_attempt(ctx)  # starts at once when nothing is left to wait for


def _replace(ctx: _Ctx, seen: _Seen, cause: Candidate) -> None:
    """Elastic: replace only the lost pods (new names, same hostnames and attempt)."""
    spec, counters, st = ctx.spec, ctx.counters, ctx.status
    budget = spec.failure_policy.max_restarts
    step = crashloop.attempt_step(st.get("ranks") or [])
    if counters["restarts"] + len(seen.failed) > budget:
        st["failure"] = _failure(cause, step)
        counters["infrastructureFailures"] += 1
        ctx.event("Warning", "RankFailed", _describe(cause))
        _finish(
            ctx,
            "Failed",
            "RestartBudgetExhausted",
            truncate(
                f"failurePolicy.maxRestarts ({budget}) spent; last failure: {_describe(cause)}"
            )
            or "",
        )
        return
    st["failure"] = _failure(cause, step)
    by_index = {c.node_index: c for c in seen.candidates}
    for i in sorted(seen.failed):
        old = st["ranks"][i]["pod"]
        # Derived from the status alone (the pod it replaces), never "the next free name":
        # a retry after a lost write must plan the very same pod.
        r = _replacement_of(ctx, i, old) + 1
        pod = render_pod(ctx.job, i, ctx.attempt, r)
        new = pod["metadata"]["name"]
        ctx.create_pod(pod)
        st["ranks"][i] = {"index": i, "pod": new, "phase": "Creating"}
        counters["restarts"] += 1
        counters["infrastructureFailures"] += 1
        why = by_index[i]
        _record_restart(
            ctx,
            {
                "reason": why.reason,
                "rank": why.rank,
                "index": i,
                "nodeRank": why.node_rank,
                "kind": "replacement",
            },
        )
        ctx.event(
            "Warning",
            "PodReplaced",
            f"index {i}: pod {old} {why.reason}; replaced by {new}",
        )


# ---- finishing ----------------------------------------------------------------------------


def _finish(ctx: _Ctx, phase: str, reason: str, message: str) -> None:
    st = ctx.status
    st["phase"] = phase
    st["completionTime"] = ctx.stamp
    ctx.set_cond(phase, True, reason, message)
    ctx.set_cond("Running", False, reason, message)
    if cond.is_true(ctx.conds, "Restarting"):
        ctx.set_cond("Restarting", False, reason, message)
    ctx.event("Normal" if phase == "Succeeded" else "Warning", phase, message)
    _after_finish(ctx)


def _after_finish(ctx: _Ctx) -> None:
    """Clean pods per cleanPodPolicy, then delete the job once its TTL is due."""
    policy = ctx.spec.run_policy
    if policy.clean_pod_policy == "Delete":
        ctx.delete_pods(ctx.pods)
    elif policy.clean_pod_policy == "KeepFailed":
        ctx.delete_pods([p for p in ctx.pods if p.phase != "Failed"])
    elif ctx.status["phase"] == "Succeeded" and ctx.spec.success_policy == "RankZero":
        ctx.delete_pods([p for p in ctx.pods if not p.terminal])
    ttl = policy.ttl_seconds_after_finished
    done = seconds(ctx.status.get("completionTime"))
    if ttl is not None and done is not None:
        left = done + ttl - ctx.now
        if left <= 0:
            ctx.delete_job = True
        else:
            ctx.requeue.append(left)


def _counts(desired: int, pods: list[PodView] | None = None, failed: int = 0) -> dict[str, Any]:
    pods = pods or []
    ready = sum(1 for p in pods if p.ready)
    return {
        "desired": desired,
        "scheduled": sum(1 for p in pods if p.node),
        "running": sum(1 for p in pods if p.phase == "Running" and not p.terminating),
        "ready": ready,
        "succeeded": sum(1 for p in pods if p.phase == "Succeeded"),
        "failed": failed,
        "summary": f"{ready}/{desired}",
    }
