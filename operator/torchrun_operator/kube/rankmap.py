"""The live rank map: reads each running training pod's launcher status endpoint.

Training pods have no API access. Their launcher serves what it knows, read-only, at
`GET http://<pod IP>:29401/status` (the pod contract, docs/pod-contract.md): its node rank, its
workers' global ranks and the rendezvous round once the agent completed a round, the script's
progress, the stacks of a stalled pod. This module reads it; the reconciler decides what it means
(`reconcile(..., live=...)`). I/O and timing only:

* `ReadSchedule` (pure, a clock passed in) decides what to read when. While some pod of a job
  has not reported a completed rendezvous, one such pod is read every second (backing off to
  5 s while the rendezvous takes minutes): rendezvous completes on every node at once, so
  when that one has, all the job's pods are read at once. A pod that turns Ready or NotReady,
  or starts running, has its job read at once. Otherwise every pod is read every 15 s or
  more: the interval grows with the number of pods and jobs so that reads stay under a rate
  budget, and a pod whose reads fail is read less often.
* `RankMapReader` runs it: one scheduler thread, a bounded pool of reads with a short timeout,
  the latest answer per pod uid, and a callback (the work queue) when a job's answers change.

What a pod answers is untrusted (a tenant's sidecar can bind the port first): each answer is
checked by reconcile/podinput.py in the reading thread and only the validated `LiveAnswer` is
kept; a refused answer is remembered (once per pod) for the controller to say. No job can
starve another: a job has at most PER_JOB_READS reads in flight, a sweep ends at its deadline
(the pods it did not reach are read first next time), and all kept answers together stay under
MAX_LIVE_BYTES.

Where the operator reaches pod IPs from: in a cluster, the operator's pod (the job's
NetworkPolicy admits it to this port); on the local cluster, the host, on the pods' bridge.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from torchrun_operator.api import names
from torchrun_operator.launcher import contract
from torchrun_operator.reconcile import podinput
from torchrun_operator.reconcile.podinput import LiveAnswer, Rejected

log = logging.getLogger(__name__)

# A launcher answers from memory in microseconds; a pod that does not answer within this is
# not worth waiting for (the next read comes soon).
READ_TIMEOUT_SECONDS = 1.0
# The most of an answer that is read: a launcher's answer is well under 8 KiB.
MAX_ANSWER_BYTES = podinput.MAX_ANSWER_BYTES
# While a job's rendezvous has not completed: one pod every second, then slower.
FAST_INTERVALS = ((120.0, 1.0), (600.0, 2.0), (float("inf"), 5.0))
# Every pod of a running job, at least this often apart.
STEADY_SECONDS = 15.0
# Rate budget for steady reads, all jobs together; the interval grows to keep under it.
MAX_READS_PER_SECOND = 40.0
MAX_SWEEPS_PER_SECOND = 4.0
# A pod that failed this many reads in a row no longer holds its job in fast reads.
MAX_FAST_FAILURES = 10
# Parallel reads, all jobs together, and of one job: a job of unreachable pods (each read
# waits READ_TIMEOUT_SECONDS) holds at most PER_JOB_READS of the readers.
PARALLEL_READS = 16
PER_JOB_READS = 4
# A sweep starts no read after this many seconds; the pods it did not reach come first in
# the job's next sweep.
SWEEP_SECONDS = 5.0
# All kept answers together (podinput.LiveAnswer.cost); an answer past it is not kept.
MAX_LIVE_BYTES = 32 * 1024 * 1024
# Benchmarks only: send every read to this host:port instead of the pod's IP, with the pod's
# IP as the request's Host, so that one stub server (bench/progress_cost.py) can answer for
# every pod with that pod's binding (rdzvId, index).
ENV_ADDRESS_OVERRIDE = "TORCHRUN_OPERATOR_STATUS_ADDRESS"


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
        return interval * min(2.0**worst, 4.0)


Read = LiveAnswer | Rejected | None


def fetch(
    ip: str,
    port: int = contract.STATUS_PORT,
    timeout: float = READ_TIMEOUT_SECONDS,
    host: str = "status",
) -> Read:
    """One GET /status, HTTP/1.0 over a plain socket, everything (connect, request, answer)
    within `timeout` and MAX_ANSWER_BYTES: a pod that answers slowly, a byte at a time, or
    without end cannot hold a reader thread longer. None when the pod does not answer in
    time, or answers anything but 200; the answer checked by podinput otherwise (a
    LiveAnswer, or Rejected with why). `host` is the request's Host header (the pod's IP
    when ENV_ADDRESS_OVERRIDE sends every read to one stub)."""
    deadline = time.monotonic() + timeout
    request = f"GET {contract.STATUS_PATH} HTTP/1.0\r\nHost: {host}\r\n\r\n"
    chunks: list[bytes] = []
    size = 0
    try:
        with socket.create_connection((ip, port), timeout=timeout) as sock:
            sock.sendall(request.encode())
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER_BYTES + 4096:  # the answer, and room for its head
                    return Rejected(f"larger than {MAX_ANSWER_BYTES} bytes")
    except OSError:
        return None
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status_line) < 2 or status_line[1] != b"200":
        return None
    return podinput.parse_answer(body)


class RankMapReader:
    """Reads the launchers of the jobs it is told about (`track`), keeps their latest
    validated answers (`live`) and the pods whose answers it refused (`rejected`), and calls
    `on_change(key)` when a job's answers changed."""

    def __init__(
        self,
        on_change: Callable[[Any], None],
        clock: Callable[[], float] = time.time,
        read: Callable[[str, int], object] | None = None,
        schedule: ReadSchedule | None = None,
        parallelism: int = PARALLEL_READS,
        per_job: int = PER_JOB_READS,
        sweep_seconds: float = SWEEP_SECONDS,
        max_bytes: int = MAX_LIVE_BYTES,
    ) -> None:
        self._on_change = on_change
        self._clock = clock
        self._read = read or _default_read()
        self._schedule = schedule or ReadSchedule()
        self._per_job = per_job
        self._sweep_seconds = sweep_seconds
        self._max_bytes = max_bytes
        self._cond = threading.Condition()
        self._stopped = False
        self._reads = ThreadPoolExecutor(parallelism, thread_name_prefix="rankmap-read")
        # A sweep mostly waits on its reads: one thread per sweep, so that a job's long sweep
        # never queues another job's.
        self._sweeps = ThreadPoolExecutor(parallelism, thread_name_prefix="rankmap-sweep")
        self._live: dict[Hashable, dict[str, tuple[float, LiveAnswer]]] = {}
        self._rejected: dict[Hashable, dict[str, tuple[float, str]]] = {}
        self._offset: dict[Hashable, int] = {}  # where the job's next sweep starts
        self._bytes = 0  # the cost of every kept answer together
        self._over = False  # whether the memory bound was said
        self.thread = threading.Thread(target=self._run, name="rankmap", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._sweeps.shutdown(wait=False, cancel_futures=True)
        self._reads.shutdown(wait=False, cancel_futures=True)

    def track(
        self,
        key: Hashable,
        pods: list[dict[str, Any]],
        attempt: int | None,
        port: int = contract.STATUS_PORT,
    ) -> None:
        """The job's pods as the controller sees them now (called on every reconcile), and
        the port their launchers' status endpoints listen on."""
        targets = targets_of(pods, attempt, port)
        with self._cond:
            self._schedule.update(key, targets, self._clock())
            uids = {t.uid for t in targets}
            live = self._live.get(key)
            if live is not None:
                for uid in set(live) - uids:
                    self._bytes -= live.pop(uid)[1].cost()
                if not live:
                    self._live.pop(key, None)
            rejected = self._rejected.get(key)
            if rejected is not None:
                for uid in set(rejected) - uids:
                    del rejected[uid]
                if not rejected:
                    self._rejected.pop(key, None)
            self._cond.notify()

    def forget(self, key: Hashable) -> None:
        with self._cond:
            self._schedule.forget(key)
            for _, answer in (self._live.pop(key, None) or {}).values():
                self._bytes -= answer.cost()
            self._rejected.pop(key, None)
            self._offset.pop(key, None)

    def live(self, key: Hashable) -> dict[str, dict[str, Any]]:
        """Per pod uid: {"at": when read (unix seconds), "data": the validated answer (None
        when none was kept)}, and "rejected": why an answer of the pod was refused, for as
        long as the pod lives (the reconciler says it once)."""
        with self._cond:
            out: dict[str, dict[str, Any]] = {
                uid: {"at": at, "data": answer}
                for uid, (at, answer) in (self._live.get(key) or {}).items()
            }
            for uid, (at, reason) in (self._rejected.get(key) or {}).items():
                out.setdefault(uid, {"at": at, "data": None})["rejected"] = reason
            return out

    def kept_bytes(self) -> int:
        with self._cond:
            return self._bytes

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = self._clock()
                due = self._schedule.due(now)
                if not due:
                    wake = self._schedule.next_wakeup()
                    self._cond.wait(None if wake is None else max(0.05, min(wake - now, 60.0)))
                    continue
            for key, targets in due:
                try:
                    self._sweeps.submit(self._sweep, key, targets)
                except RuntimeError:  # shut down
                    return

    def _read_checked(self, ip: str, port: int) -> Read:
        try:
            return _checked(self._read(ip, port))
        except Exception:  # noqa: BLE001 - a read must never stop the reader
            log.exception("reading the status at %s failed", ip)
            return None

    def _read_all(self, key: Hashable, targets: list[Target]) -> dict[str, Read]:
        """Reads `targets`, at most `per_job` at once, starting none after the sweep's
        deadline; the pods not reached are left out (and come first next time)."""
        with self._cond:
            start = self._offset.get(key, 0) % len(targets) if targets else 0
        order = targets[start:] + targets[:start]
        deadline = time.monotonic() + self._sweep_seconds
        results: dict[str, Read] = {}
        running: dict[Future[Read], Target] = {}
        queue = iter(order)
        while True:
            while len(running) < self._per_job and (
                len(results) + len(running) < self._per_job or time.monotonic() < deadline
            ):  # the first reads start whatever the deadline: every sweep reads something
                t = next(queue, None)
                if t is None:
                    break
                running[self._reads.submit(self._read_checked, t.ip, t.port)] = t
            if not running:
                break
            # With a timeout: a read cancelled by stop() is never run, and never wakes wait().
            finished, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
            if self._stopped:
                raise RuntimeError("stopped")
            for f in finished:
                results[running.pop(f).uid] = f.result()
        with self._cond:
            self._offset[key] = start + len(results)
        return results

    def _sweep(self, key: Hashable, targets: list[Target]) -> None:
        try:
            results = self._read_all(key, targets)
        except RuntimeError:  # shut down
            return
        now = self._clock()
        with self._cond:
            answers = {u: r if isinstance(r, LiveAnswer) else None for u, r in results.items()}
            partial = len(results) < len(targets)
            changed = self._schedule.done(key, answers, now, partial)
            if key in self._schedule.jobs:
                for uid, r in results.items():
                    if isinstance(r, LiveAnswer):
                        self._keep(key, uid, now, r)
                    elif isinstance(r, Rejected) and uid not in self._rejected.get(key, {}):
                        # The first refusal of the pod is what is said; later ones are not.
                        self._rejected.setdefault(key, {})[uid] = (now, r.reason)
                        changed = True
            self._cond.notify()
        if changed:
            self._on_change(key)

    def _keep(self, key: Hashable, uid: str, at: float, answer: LiveAnswer) -> None:
        """Keeps an answer, within the bound on all kept answers together (lock held)."""
        live = self._live.setdefault(key, {})
        old = live.get(uid)
        grow = answer.cost() - (old[1].cost() if old else 0)
        if self._bytes + grow > self._max_bytes:
            if not self._over:
                log.warning(
                    "live status answers take more than %d bytes: newer answers are not kept",
                    self._max_bytes,
                )
                self._over = True
            if not live:
                self._live.pop(key, None)
            return
        live[uid] = (at, answer)
        self._bytes += grow


def _checked(read: object) -> Read:
    """A read function's result as the reader keeps it: fetch's own, or a decoded answer
    (tests, benchmarks) checked here."""
    if read is None or isinstance(read, LiveAnswer | Rejected):
        return read
    return podinput.live_answer(read)


def _default_read() -> Callable[[str, int], Read]:
    override = os.environ.get(ENV_ADDRESS_OVERRIDE)
    if override:
        host, _, port = override.rpartition(":")
        log.warning("reading every pod's status from %s (%s)", override, ENV_ADDRESS_OVERRIDE)
        return lambda ip, _: fetch(host, int(port), host=ip)
    return fetch
