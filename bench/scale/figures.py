"""From what the benchmark saw (timestamped pod and job observations) to figures. Pure.

Every time is the benchmark process's clock when its watch delivered the event, so pod and
job times compare directly, the same way for both operators.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .workloads import KUBEFLOW, TRAINER, Workload

STARTED = ("Running", "Succeeded", "Failed")
FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodObs:
    t: float
    uid: str
    name: str
    job: str
    phase: str
    deleting: bool
    gone: bool  # a DELETED watch event


@dataclass(frozen=True)
class JobObs:
    t: float
    name: str
    running: bool
    succeeded: bool
    failed: bool
    restarting: bool
    started: int  # pods the job's status counts as running, succeeded or failed
    finished: int  # pods it counts as succeeded or failed
    # The status counts pods in steps of this many: 1 for ours and training-operator (pod
    # counters); a Trainer job's N pods (it counts child Jobs, each of N pods).
    step: int = 1


def pod_obs(t: float, event: str, pod: dict[str, Any], job_label: str) -> PodObs:
    meta = pod.get("metadata") or {}
    return PodObs(
        t=t,
        uid=str(meta.get("uid", "")),
        name=str(meta.get("name", "")),
        job=str((meta.get("labels") or {}).get(job_label, "")),
        phase=str((pod.get("status") or {}).get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        gone=event == "DELETED",
    )


def _true_conditions(st: dict[str, Any]) -> set[str]:
    return {str(c.get("type")) for c in st.get("conditions") or [] if c.get("status") == "True"}


def trainer_obs(t: float, job: dict[str, Any]) -> JobObs:
    """A TrainJob's status: conditions Complete / Failed, and `jobsStatus`, which Trainer
    copies from its JobSet's `replicatedJobsStatus`: per replicated job, how many child Jobs
    are ready (ready + succeeded pods >= the Job's parallelism), succeeded or failed. The
    torch runtime has one replicated job, `node`, of one Job of `numNodes` pods, so its status
    counts pods only in steps of numNodes: all started (ready, succeeded or failed) or all
    finished. Running: every replicated job has a ready or succeeded Job. Restarts are not in
    a TrainJob's status; they are the JobSet's (jobset_obs)."""
    name = str((job.get("metadata") or {}).get("name", ""))
    st = job.get("status") or {}
    nodes = int(((job.get("spec") or {}).get("trainer") or {}).get("numNodes") or 1)
    true = _true_conditions(st)
    jobs = st.get("jobsStatus") or []

    def n(key: str) -> int:
        return sum(int(j.get(key) or 0) for j in jobs)

    running = bool(jobs) and all(
        int(j.get("ready") or 0) + int(j.get("succeeded") or 0) > 0 for j in jobs
    )
    done = n("succeeded") + n("failed")
    return JobObs(
        t, name, running and not true & {"Complete", "Failed"}, "Complete" in true,
        "Failed" in true, False, (n("ready") + done) * nodes, done * nodes, nodes,
    )  # fmt: skip


def jobset_obs(t: float, jobset: dict[str, Any]) -> JobObs:
    """A JobSet's status, for its restarts only: `status.restarts` > 0 means JobSet's failure
    policy has started a new attempt (it counts attempts, from 0)."""
    name = str((jobset.get("metadata") or {}).get("name", ""))
    restarts = int((jobset.get("status") or {}).get("restarts") or 0)
    return JobObs(t, name, False, False, False, restarts > 0, 0, 0)


def job_obs(t: float, kind: str, job: dict[str, Any]) -> JobObs:
    """Our status: phase and nodes counters. training-operator's: True conditions and the
    replicaStatuses counters (active = Running pods). Trainer's: trainer_obs."""
    if kind == TRAINER:
        return trainer_obs(t, job)
    name = str((job.get("metadata") or {}).get("name", ""))
    st = job.get("status") or {}
    if kind == KUBEFLOW:
        true = _true_conditions(st)
        reps = (st.get("replicaStatuses") or {}).values()
        active = sum(int(r.get("active") or 0) for r in reps)
        succ = sum(int(r.get("succeeded") or 0) for r in reps)
        fail = sum(int(r.get("failed") or 0) for r in reps)
        return JobObs(
            t, name, "Running" in true, "Succeeded" in true, "Failed" in true,
            "Restarting" in true, active + succ + fail, succ + fail,
        )  # fmt: skip
    nodes = st.get("nodes") or {}
    running, succ, fail = (int(nodes.get(k) or 0) for k in ("running", "succeeded", "failed"))
    phase = st.get("phase")
    return JobObs(
        t, name, phase == "Running", phase == "Succeeded", phase == "Failed",
        phase == "Restarting", running + succ + fail, succ + fail,
    )  # fmt: skip


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def _first_true(jobs: list[JobObs], attr: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for j in jobs:
        if getattr(j, attr) and j.name not in out:
            out[j.name] = j.t
    return out


def _latest(pods: list[PodObs]) -> dict[str, PodObs]:
    return {p.uid: p for p in pods}


def _alive_running(p: PodObs) -> bool:
    return p.phase == "Running" and not p.deleting and not p.gone


def victim(pods: list[PodObs], job: str) -> PodObs | None:
    """The pod a gang-restart run fails: the job's second Running pod by name (a worker,
    never rank 0 / the master), else its only one; None when none of its pods runs any more
    (they finished before the job's status caught up with them)."""
    latest = _latest([p for p in pods if p.job == job])
    alive = sorted((p for p in latest.values() if _alive_running(p)), key=lambda p: p.name)
    if not alive:
        return None
    return alive[1] if len(alive) > 1 else alive[0]


# Recorded, in place of the restart figures, for a run whose pods all finished before its
# job's status counted them all Running (Trainer v2's `big` at its defaults did, 2026-11-29).
NO_POD_TO_FAIL = "its job's status counted every pod Running only after the pods had finished"


def all_running_times(pods: list[PodObs], nodes: int) -> dict[str, float]:
    """Per job, the first time every one of its `nodes` pods was Running at once."""
    state: dict[str, PodObs] = {}
    count: dict[str, int] = defaultdict(int)
    out: dict[str, float] = {}
    for p in pods:
        before = state.get(p.uid)
        count[p.job] += int(_alive_running(p)) - int(before is not None and _alive_running(before))
        state[p.uid] = p
        if count[p.job] >= nodes and p.job not in out:
            out[p.job] = p.t
    return out


def status_lags(pods: list[PodObs], jobs: list[JobObs]) -> tuple[list[float], int]:
    """For every pod that starts or finishes, how long until its job's status counts it: the
    k-th pod of a job to reach Running (or to finish) is reflected by the first later job
    observation that counts at least k. A status that counts pods in steps (JobObs.step) can
    only reflect the k-th pod where k is a whole step (a Trainer job's last pod to start or
    finish); the others are left out. Returns the lags and how many were never reflected."""
    seen_started: set[str] = set()
    seen_finished: set[str] = set()
    k_started: dict[str, int] = defaultdict(int)
    k_finished: dict[str, int] = defaultdict(int)
    targets: list[tuple[float, str, str, int]] = []
    for p in pods:
        if p.phase in STARTED and p.uid not in seen_started:
            seen_started.add(p.uid)
            k_started[p.job] += 1
            targets.append((p.t, p.job, "started", k_started[p.job]))
        if p.phase in FINISHED and p.uid not in seen_finished:
            seen_finished.add(p.uid)
            k_finished[p.job] += 1
            targets.append((p.t, p.job, "finished", k_finished[p.job]))
    by_job: dict[str, list[JobObs]] = defaultdict(list)
    for j in jobs:
        by_job[j.name].append(j)
    step = {name: max(1, obs[0].step) for name, obs in by_job.items()}
    lags: list[float] = []
    missed = 0
    for t, job, what, k in targets:
        if k % step.get(job, 1):
            continue
        hit = next((j.t for j in by_job[job] if j.t >= t and getattr(j, what) >= k), None)
        if hit is None:
            missed += 1
        else:
            lags.append(hit - t)
    return lags, missed


@dataclass(frozen=True)
class Restart:
    failed_at: float  # the failing pod observed Failed
    recovered_at: float | None  # every pod Running again
    replaced: int  # pods created after the failure


def restart(pods: list[PodObs], job: str, nodes: int, fault_uid: str) -> Restart | None:
    failed_at = next((p.t for p in pods if p.uid == fault_uid and p.phase == "Failed"), None)
    if failed_at is None:
        return None
    before = {p.uid for p in pods if p.t < failed_at}
    state = _latest([p for p in pods if p.t < failed_at and p.job == job])
    recovered = None
    for p in pods:
        if p.t < failed_at or p.job != job:
            continue
        state[p.uid] = p
        if sum(1 for q in state.values() if _alive_running(q)) >= nodes:
            recovered = p.t
            break
    new = {p.uid for p in pods if p.job == job and p.uid not in before}
    return Restart(failed_at, recovered, len(new))


def compute(
    w: Workload,
    kind: str,
    pods: list[PodObs],
    jobs: list[JobObs],
    t0: float,
    fault_uid: str | None = None,
    restart_jobs: list[JobObs] | None = None,
) -> dict[str, Any]:
    """The figures of one run. Times are seconds since the first create (t0). Before a fault
    only: creation, all-Running and status lag; the restart has its own figures, for which
    `restart_jobs` (default: `jobs`) are the observations that say the job restarts."""
    names = set(w.job_names())
    pods = sorted((p for p in pods if p.job in names), key=lambda p: p.t)
    jobs = sorted((j for j in jobs if j.name in names), key=lambda j: j.t)
    out: dict[str, Any] = {}
    rs = restart(pods, w.job_names()[0], w.nodes, fault_uid) if fault_uid else None
    cut = rs.failed_at if rs else math.inf
    pre_pods = [p for p in pods if p.t < cut]
    pre_jobs = [j for j in jobs if j.t < cut]

    created: dict[str, float] = {}
    for p in pre_pods:
        created.setdefault(p.uid, p.t)
    out["pods"] = len(created)
    out["pods_created_s"] = (
        sorted(created.values())[w.pods - 1] - t0 if len(created) >= w.pods else None
    )
    running = all_running_times(pre_pods, w.nodes)
    out["pods_running_s"] = max(running.values()) - t0 if len(running) == len(names) else None
    jobs_running = _first_true(pre_jobs, "running")
    out["jobs_running_s"] = (
        max(jobs_running.values()) - t0 if len(jobs_running) == len(names) else None
    )
    succeeded = _first_true(jobs, "succeeded")
    failed = _first_true(jobs, "failed")
    out["jobs_succeeded"] = len(succeeded)
    out["jobs_failed"] = len(failed)
    out["jobs_done_s"] = max(succeeded.values()) - t0 if len(succeeded) == len(names) else None

    last_finish: dict[str, float] = {}
    for p in pods:
        if p.phase == "Succeeded":
            last_finish[p.job] = max(last_finish.get(p.job, 0.0), p.t)
    finish_lags = [succeeded[j] - last_finish[j] for j in succeeded if j in last_finish]
    out["finish_lag_max_s"] = max(finish_lags) if finish_lags else None
    out["finish_lag_p50_s"] = percentile(finish_lags, 50)

    lags, missed = status_lags(pre_pods, pre_jobs)
    out["status_lag_p50_s"] = percentile(lags, 50)
    out["status_lag_p95_s"] = percentile(lags, 95)
    out["status_lag_max_s"] = max(lags) if lags else None
    out["status_lag_samples"] = len(lags)
    out["status_lag_missed"] = missed

    if rs is not None:
        says = sorted(
            (j for j in (jobs if restart_jobs is None else restart_jobs) if j.name in names),
            key=lambda j: j.t,
        )
        decided = next((j.t for j in says if j.t >= rs.failed_at and j.restarting), None)
        out["restart_s"] = rs.recovered_at - rs.failed_at if rs.recovered_at else None
        out["restart_pods_replaced"] = rs.replaced
        out["restart_status_noticed_s"] = decided - rs.failed_at if decided else None
    return out
