"""Kueue admission, decided from the job's Workload: pure, like the rest of reconcile/.

Two questions, asked on every reconcile of a job queued through Kueue (docs/scheduling.md):

- `admission(job, workload)`: may the job run pods now? Only while its Workload is admitted
  and not evicted. Otherwise it waits (phase Queued) with Kueue's own reason and message, and
  whatever pods it has are deleted, as for a suspension: no failure, no restart counted.
- `workload_actions(...)`: what the operator does to its Workload, as Kueue's own job
  integrations do for their jobs: create it; replace it when the job changed while it waited;
  deactivate it while runPolicy.suspend is true (Kueue then evicts it and its quota is freed);
  after an eviction, once every pod is gone, clear its quota reservation so that Kueue can
  queue it again; mark it Finished when the job ends and none of its pods runs any more;
  replace it when Kueue left it waiting for ever because it could not read its namespace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..api.timefmt import fmt, seconds
from ..render import kueue

# Kueue's Workload conditions (kueue.x-k8s.io/v1beta2).
ADMITTED = "Admitted"
QUOTA_RESERVED = "QuotaReserved"
EVICTED = "Evicted"
FINISHED = "Finished"
REQUEUED = "Requeued"
# Evictions after which Kueue's own job integrations mark the Workload Requeued=True at once;
# after the others (deactivation, a pods-ready timeout, an admission check) Kueue requeues it
# itself when their cause is gone (reactivation, back-off).
REQUEUE_AT_ONCE = ("Preempted", "NodeFailures")
# What Kueue's scheduler (v0.17, `nominate`) writes on QuotaReserved when its cached read of the
# Workload's Namespace fails. It then holds the Workload as inadmissible and moves it back to
# its queue only on an event of the ClusterQueue, a flavor, an admission check or a change of
# the Namespace's labels, never for the Workload itself. Its cache can miss a namespace for a
# moment after an apiserver restart (seen in fault campaigns, docs/reliability.md): the job then
# waited Queued for ever on an empty ClusterQueue.
NAMESPACE_UNREAD = "Could not obtain workload namespace"
# How long the operator leaves a Workload with that message before it queues a new one: long
# enough for Kueue's cache to catch up (it relists within seconds of an apiserver's return), so
# a namespace that is really gone does not churn Workloads; short against a job's wait.
NAMESPACE_UNREAD_RETRY_SECONDS = 15.0


@dataclass(frozen=True)
class Admission:
    """What Kueue says about a queued job. `reason` and `message` come from the Workload's
    conditions (Kueue's own words) whenever it has one that explains them."""

    admitted: bool
    reason: str
    message: str


def _cond(workload: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (workload.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c  # type: ignore[no-any-return]
    return None


def _true(workload: Mapping[str, Any], type_: str) -> bool:
    c = _cond(workload, type_)
    return c is not None and c.get("status") == "True"


def _active(workload: Mapping[str, Any]) -> bool:
    return (workload.get("spec") or {}).get("active", True) is not False


def has_reservation(workload: Mapping[str, Any]) -> bool:
    return _true(workload, QUOTA_RESERVED)


def namespace_unread(workload: Mapping[str, Any]) -> bool:
    """Kueue holds the Workload back because it could not read its namespace (see above)."""
    c = _cond(workload, QUOTA_RESERVED)
    return (
        c is not None
        and c.get("status") == "False"
        and str(c.get("message") or "").startswith(NAMESPACE_UNREAD)
    )


def namespace_unread_wait(unread_since: float, now: float) -> float:
    """Seconds left before a Workload held back by `namespace_unread` since `unread_since`
    (the operator's clock) is replaced; 0 or less: now."""
    return unread_since + NAMESPACE_UNREAD_RETRY_SECONDS - now


def admission(
    job: Mapping[str, Any], workload: Mapping[str, Any] | None, priority: int | None = None
) -> Admission | None:
    """None when the job is not queued through Kueue. `workload`: the job's own Workload
    (controller uid), None while it does not exist. `priority`: the value of the
    WorkloadPriorityClass the job names, None if it names none or it does not exist."""
    queue = kueue.queue_name(job)
    if queue is None:
        return None
    if workload is None:
        wanted = kueue.priority_class(job)
        if wanted is not None and priority is None:
            message = f"WorkloadPriorityClass {wanted} not found; its Workload waits for it"
            return Admission(False, "WorkloadPriorityClassNotFound", message)
        return Admission(False, "WorkloadCreating", f"creating its Workload in queue {queue}")
    name = workload["metadata"]["name"]
    if _true(workload, FINISHED):
        c = _cond(workload, FINISHED) or {}
        return Admission(
            False, str(c.get("reason") or FINISHED), _text(c, f"Workload {name} is finished")
        )
    if _true(workload, EVICTED):
        # Until Kueue admits it again, the eviction is the reason; once the quota is released,
        # what Kueue says about the new attempt to admit it is added.
        c = _cond(workload, EVICTED) or {}
        message = _text(c, f"Workload {name} was evicted")
        again = _cond(workload, QUOTA_RESERVED) or {}
        if again.get("status") == "False" and again.get("message") not in (None, "", message):
            message = f"{message}; now: {again['message']}"
        return Admission(False, str(c.get("reason") or EVICTED), message)
    if _true(workload, ADMITTED):
        cq = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
        where = f" by ClusterQueue {cq}" if cq else ""
        return Admission(True, "Admitted", f"Workload {name} admitted{where}")
    if not _active(workload):
        return Admission(False, "Inactive", f"Workload {name} is deactivated (spec.active: false)")
    # Waiting: Kueue says why on QuotaReserved (e.g. "couldn't assign flavors to pod set
    # workers: insufficient unused quota ..."), or on Admitted once quota is reserved but an
    # admission check is pending.
    for type_ in (QUOTA_RESERVED, ADMITTED):
        why = _cond(workload, type_)
        if why is not None and why.get("status") == "False" and why.get("message"):
            return Admission(False, str(why.get("reason") or type_), str(why["message"]))
    return Admission(False, "Queued", f"Workload {name} waits in queue {queue} for Kueue")


def _text(c: Mapping[str, Any], default: str) -> str:
    return str(c.get("message") or default)


# ---- what the operator does to its Workload --------------------------------------------------


@dataclass(frozen=True)
class WorkloadAction:
    """One change to the job's Workload; the shell carries it out with the Workload's uid
    (delete) or resourceVersion (patches) as precondition, so a Workload that changed since it
    was read is read and decided again, never overwritten."""

    kind: Literal["create", "delete", "set_active", "patch_status"]
    body: dict[str, Any] = field(default_factory=dict)  # create: the Workload; else the patch
    why: str = ""


def workload_actions(
    job: Mapping[str, Any],
    status: Mapping[str, Any],
    workload: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    now: float,
    priority: int | None = None,
    unread_since: float | None = None,
) -> list[WorkloadAction]:
    """`status`: the job's status as just planned (and written); `pods`: the pods observed
    under the job's name (any attempt, terminating ones included; only the job's own count);
    `priority`: as for admission() (read only while there is no Workload); `unread_since`:
    when the operator first saw this Workload held back by `namespace_unread` (its own clock,
    not Kueue's). The quota is given back (Finished, or released after an eviction) only once
    the pods holding it stopped: Kueue would otherwise admit another job onto resources still
    in use."""
    queued = kueue.queue_name(job) is not None
    if not queued:
        # The label was removed: the job no longer waits for Kueue, nor holds its quota.
        return [WorkloadAction("delete", why="the job has no queue-name label")] if workload else []
    finished = status.get("phase") in ("Succeeded", "Failed")
    uid = str((job.get("metadata") or {}).get("uid"))
    if finished:
        if workload is None or _true(workload, FINISHED) or pods_running(pods, uid):
            return []  # a pod still running wakes the job again when it stops
        return [WorkloadAction("patch_status", _finish(workload, status, now), "job finished")]
    suspend = bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
    if workload is None:
        if kueue.priority_class(job) is not None and priority is None:
            return []  # the class it names does not exist (yet): the status says so
        body = kueue.render_workload(job, active=not suspend, priority=priority)
        return [WorkloadAction("create", body)]
    wanted = kueue.render_workload(job)
    if kueue.spec_hash(workload) != kueue.spec_hash(wanted) and not has_reservation(workload):
        # Kueue does not let a Workload's pod sets change; a new one is queued afresh.
        return [WorkloadAction("delete", why="the job changed while it waited")]
    ours = (workload["metadata"].get("annotations") or {}).get(kueue.DEACTIVATED_ANNOTATION)
    if suspend and _active(workload):
        return [WorkloadAction("set_active", _activation(False), "runPolicy.suspend is true")]
    if not suspend and not _active(workload) and ours:
        return [WorkloadAction("set_active", _activation(True), "runPolicy.suspend is false")]
    if _true(workload, EVICTED) and has_reservation(workload) and pods_left(pods, uid) == 0:
        return [WorkloadAction("patch_status", _release(workload, now), "evicted; pods gone")]
    if (
        not suspend
        and _active(workload)
        and not has_reservation(workload)
        and namespace_unread(workload)
        and unread_since is not None
        and namespace_unread_wait(unread_since, now) <= 0
    ):
        # Nothing of the Workload's own moves Kueue to try it again; a new Workload is queued
        # and read afresh. It holds no quota, so nothing is freed or lost but its place.
        why = "Kueue could not read its namespace and would not try again"
        return [WorkloadAction("delete", why=why)]
    return []


def _activation(active: bool) -> dict[str, Any]:
    """A merge patch: the Workload's spec.active, and our mark of a deactivation we made."""
    mark = None if active else "true"
    return {
        "metadata": {"annotations": {kueue.DEACTIVATED_ANNOTATION: mark}},
        "spec": {"active": active},
    }


def _set(
    conds: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    stamp: str,
    generation: Any,
) -> None:
    value = "True" if status else "False"
    new: dict[str, Any] = {"type": type_, "status": value, "reason": reason, "message": message}
    if generation is not None:
        new["observedGeneration"] = generation
    for i, c in enumerate(conds):
        if c.get("type") == type_:
            new["lastTransitionTime"] = (
                c.get("lastTransitionTime") if c.get("status") == value else stamp
            ) or stamp
            conds[i] = new
            return
    conds.append({**new, "lastTransitionTime": stamp})


def _release(workload: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The Workload's status with its quota reservation cleared after an eviction, as Kueue's
    job integrations clear it once their job stopped: QuotaReserved and Admitted false, no
    admission, Requeued as Kueue decides it for that kind of eviction, and the time it ran
    added to accumulatedPastExecutionTimeSeconds."""
    status = dict(workload.get("status") or {})
    conds = [dict(c) for c in status.get("conditions") or []]
    gen = workload["metadata"].get("generation")
    stamp = fmt(now)
    evicted = _cond(workload, EVICTED) or {}
    reason, message = str(evicted.get("reason") or EVICTED), str(evicted.get("message") or "")
    admitted = _cond(workload, ADMITTED)
    if admitted is not None and admitted.get("status") == "True":
        since = seconds(admitted.get("lastTransitionTime"))
        if since is not None:
            past = int(status.get("accumulatedPastExecutionTimeSeconds") or 0)
            status["accumulatedPastExecutionTimeSeconds"] = past + max(0, int(now - since))
    _set(conds, REQUEUED, reason in REQUEUE_AT_ONCE, reason, message, stamp, gen)
    _set(conds, QUOTA_RESERVED, False, "Pending", message, stamp, gen)
    _set(conds, ADMITTED, False, "NoReservation", "The workload has no reservation", stamp, gen)
    status["conditions"] = conds
    status.pop("admission", None)
    return status


def _finish(
    workload: Mapping[str, Any], job_status: Mapping[str, Any], now: float
) -> dict[str, Any]:
    """The Workload's status with Finished=True: Kueue then releases the job's quota."""
    status = dict(workload.get("status") or {})
    conds = [dict(c) for c in status.get("conditions") or []]
    phase = str(job_status.get("phase"))
    final = (
        next((c for c in job_status.get("conditions") or [] if c.get("type") == phase), None) or {}
    )
    message = str(final.get("message") or f"the job {phase.lower()}")
    gen = workload["metadata"].get("generation")
    _set(conds, FINISHED, True, phase, message, fmt(now), gen)
    status["conditions"] = conds
    return status


def _own(pod: Mapping[str, Any], job_uid: str) -> bool:
    return any(
        ref.get("controller") and ref.get("uid") == job_uid
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or []
    )


def pods_left(pods: Sequence[Mapping[str, Any]], job_uid: str) -> int:
    """The job's own pods (controller uid) that still exist, in any state."""
    return sum(1 for p in pods if _own(p, job_uid))


def pods_running(pods: Sequence[Mapping[str, Any]], job_uid: str) -> int:
    """The job's own pods that may still hold their node's resources: every one that has
    not ended (Succeeded or Failed), terminating ones included. An ended pod, kept by the
    cleanPodPolicy, holds none (the scheduler counts it no more)."""
    ended = ("Succeeded", "Failed")
    return sum(
        1 for p in pods if _own(p, job_uid) and (p.get("status") or {}).get("phase") not in ended
    )
