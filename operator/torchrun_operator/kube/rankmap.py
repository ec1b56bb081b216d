"""The live rank map: reads each running training pod's launcher status endpoint.

Training pods have no API access. Their launcher serves what it knows, read-only, at
`GET http://<pod IP>:29401/status` (the pod contract, docs/pod-contract.md): its node rank, its
workers' global ranks and the rendezvous round once the agent completed a round, the script's
progress, the stacks of a stalled pod. This module reads it; the reconciler decides what it means
(`reconcile(..., live=...)`). I/O and timing only:

* `ReadSchedule` (kube/readschedule.py: pure, a clock passed in) decides what to read when:
  one waiting pod a second while a job's rendezvous is not done, every pod every 15 s or more
  after, within a rate budget.
* `fetch` (kube/statusread.py) is one read, bounded in time and size.
* `RankMapReader` (here) runs them: one scheduler thread, a bounded pool of reads with a
  short timeout, the latest answer per pod uid, and a callback (the work queue) when a job's
  answers change.

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
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from torchrun_operator.kube.readschedule import ReadSchedule, Target, targets_of
from torchrun_operator.kube.statusread import Read, checked, default_read
from torchrun_operator.launcher import contract
from torchrun_operator.reconcile.podinput import LiveAnswer, Rejected

log = logging.getLogger(__name__)

# Parallel reads, all jobs together, and of one job: a job of unreachable pods (each read
# waits READ_TIMEOUT_SECONDS) holds at most PER_JOB_READS of the readers.
PARALLEL_READS = 16
PER_JOB_READS = 4
# A sweep starts no read after this many seconds; the pods it did not reach come first in
# the job's next sweep.
SWEEP_SECONDS = 5.0
# All kept answers together (podinput.LiveAnswer.cost); an answer past it is not kept.
MAX_LIVE_BYTES = 32 * 1024 * 1024


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
        self._read = read or default_read()
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
            return checked(self._read(ip, port))
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
