"""What the rank-map reader (kube/rankmap.py) reads when: the pods worth reading (`Target`,
`targets_of`) and `ReadSchedule`, pure (the caller passes the clock and holds the lock).

While some pod of a job has not reported a completed rendezvous, one such pod is read every
second (backing off to 5 s while the rendezvous takes minutes): rendezvous completes on every
node at once, so when that one has, all the job's pods are read at once. A pod that turns
Ready or NotReady, or starts running, has its job read at once. Otherwise every pod is read
every 15 s or more: the interval grows with the number of pods and jobs so that reads stay
under a rate budget, and a pod whose reads fail is read less often (kube/backoff.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchrun_operator.api import names
from torchrun_operator.kube.backoff import doubling
from torchrun_operator.launcher import contract
from torchrun_operator.reconcile.podinput import LiveAnswer

# While a job's rendezvous has not completed: one pod every second, then slower.
FAST_INTERVALS = ((120.0, 1.0), (600.0, 2.0), (float("inf"), 5.0))
# Every pod of a running job, at least this often apart.
STEADY_SECONDS = 15.0
# Rate budget for steady reads, all jobs together; the interval grows to keep under it.
MAX_READS_PER_SECOND = 40.0
MAX_SWEEPS_PER_SECOND = 4.0
# A pod that failed this many reads in a row no longer holds its job in fast reads.
MAX_FAST_FAILURES = 10


@dataclass(frozen=True)
class Target:
    """A running pod of the current attempt that has an IP."""

    uid: str
    name: str
    ip: str
    ready: bool
    port: int = contract.STATUS_PORT  # the launcher's status port (render/ports.py)


def targets_of(
    pods: list[dict[str, Any]], attempt: int | None, port: int = contract.STATUS_PORT
) -> list[Target]:
    """The pods worth reading: running, not being deleted, of the job's current attempt;
    their launchers listen on `port`."""
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        labels = meta.get("labels") or {}
        if attempt is not None and labels.get(names.LABEL_ATTEMPT) != str(attempt):
            continue
        if status.get("phase") != "Running" or meta.get("deletionTimestamp"):
            continue
        ip, uid = status.get("podIP"), meta.get("uid")
        if not ip or not uid:
            continue
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        out.append(Target(uid, meta.get("name", ""), ip, ready, port))
    return sorted(out, key=lambda t: t.name)


def rendezvoused(answer: LiveAnswer | None) -> bool:
    """Whether an answer shows a completed rendezvous (the pod knows its node rank)."""
    return answer is not None and answer.rendezvoused


@dataclass
class _Job:
    targets: dict[str, Target] = field(default_factory=dict)
    answers: dict[str, LiveAnswer] = field(default_factory=dict)  # uid -> latest answer
    failures: dict[str, int] = field(default_factory=dict)  # uid -> failed reads in a row
    next_due: float = 0.0
    full: bool = True  # the next sweep reads every pod
    in_flight: bool = False
    waiting_since: float | None = None  # when fast reads began
    turn: int = 0  # which waiting pod the next fast read picks

    def waiting(self) -> list[Target]:
        return [
            t
            for uid, t in sorted(self.targets.items(), key=lambda kv: kv[1].name)
            if not rendezvoused(self.answers.get(uid))
            and self.failures.get(uid, 0) < MAX_FAST_FAILURES
        ]


class ReadSchedule:
    """What to read when, per job; pure (the caller passes the clock and locks)."""

    def __init__(
        self,
        steady: float = STEADY_SECONDS,
        reads_per_second: float = MAX_READS_PER_SECOND,
        sweeps_per_second: float = MAX_SWEEPS_PER_SECOND,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.steady = steady
        self.reads_per_second = reads_per_second
        self.sweeps_per_second = sweeps_per_second
        self.jitter = jitter
        self.jobs: dict[Hashable, _Job] = {}

    def update(self, key: Hashable, targets: list[Target], now: float) -> None:
        """The job's readable pods now. A new pod, or one whose readiness flipped, makes the
        job due now; pods that are gone are forgotten."""
        job = self.jobs.get(key)
        if not targets:
            self.jobs.pop(key, None)
            return
        if job is None:
            job = self.jobs[key] = _Job(next_due=now)
        fresh = {t.uid: t for t in targets}
        changed = any(
            uid not in job.targets or job.targets[uid].ready != t.ready for uid, t in fresh.items()
        )
        for uid in set(job.targets) - set(fresh):
            job.answers.pop(uid, None)
            job.failures.pop(uid, None)
        job.targets = fresh
        if changed:
            job.full = True
            job.next_due = min(job.next_due, now)

    def forget(self, key: Hashable) -> None:
        self.jobs.pop(key, None)

    def due(self, now: float) -> list[tuple[Hashable, list[Target]]]:
        """The sweeps to start now; each job is marked in flight until done()."""
        out = []
        for key, job in self.jobs.items():
            if job.in_flight or job.next_due > now:
                continue
            waiting = job.waiting()
            if job.full or not waiting:
                reads = list(job.targets.values())
            else:
                reads = [waiting[job.turn % len(waiting)]]
                job.turn += 1
            job.in_flight = True
            job.full = False
            out.append((key, reads))
        return out

    def done(
        self,
        key: Hashable,
        results: Mapping[str, LiveAnswer | None],
        now: float,
        partial: bool = False,
    ) -> bool:
        """A sweep's answers (uid -> answer, None for a failed or refused read; a pod the
        sweep did not reach is left out, and `partial` says there are such pods: the job's
        next sweep, due now, reads every pod again, starting with those). True when an answer
        changed (the job is worth reconciling)."""
        job = self.jobs.get(key)
        if job is None:
            return False
        job.in_flight = False
        changed = False
        newly_rendezvoused = False
        for uid, data in results.items():
            if uid not in job.targets:
                continue
            if data is None:
                job.failures[uid] = job.failures.get(uid, 0) + 1
                continue
            job.failures.pop(uid, None)
            old = job.answers.get(uid)
            if not rendezvoused(old) and rendezvoused(data):
                newly_rendezvoused = True
            if old != data:
                changed = True
            job.answers[uid] = data
        waiting = job.waiting()
        if partial:
            job.full = True
            job.next_due = now
        elif newly_rendezvoused and waiting:
            # One pod completed a round: so did (or will, in a moment) every other.
            job.full = True
            job.next_due = now
        elif waiting:
            if job.waiting_since is None:
                job.waiting_since = now
            job.next_due = now + self._fast(now - job.waiting_since, job)
        else:
            job.waiting_since = None
            job.next_due = now + self._steady(job) * (0.9 + 0.2 * self.jitter())
        return changed

    def next_wakeup(self) -> float | None:
        due = [j.next_due for j in self.jobs.values() if not j.in_flight]
        return min(due) if due else None

    def _fast(self, waited: float, job: _Job) -> float:
        """A waiting job's next fast read: FAST_INTERVALS, but no sooner than the read budget
        allows with every job that waits read once each (a pod may say it waits for ever)."""
        waiting = sum(1 for j in self.jobs.values() if j.waiting_since is not None or j is job)
        fast = next(interval for limit, interval in FAST_INTERVALS if waited < limit)
        return max(fast, waiting / self.reads_per_second)

    def _steady(self, job: _Job) -> float:
        pods = sum(len(j.targets) for j in self.jobs.values())
        interval = max(
            self.steady, pods / self.reads_per_second, len(self.jobs) / self.sweeps_per_second
        )
        # A pod that keeps failing is read less often, up to 4 times the interval.
        worst = max(job.failures.values(), default=0)
        return doubling(interval, worst + 1, 4 * interval)
