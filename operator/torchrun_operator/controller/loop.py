"""The controller: caches fed by watches, a work queue of jobs, and workers that apply plans.

Every decision is made by the pure `reconcile.reconcile`; this module only fetches what it
needs from the caches (and the latest answers of the pods' launcher status endpoints, which
kube/rankmap.py reads), calls it, and carries the plan out against the API. It is
level-triggered: whatever woke a job up, the job is reconciled from the whole observed state.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from torchrun_operator import metrics, testplant
from torchrun_operator.api.status_names import FINISHED, Phase
from torchrun_operator.controller.children import controller_uid
from torchrun_operator.controller.kueuesync import KueueSync
from torchrun_operator.controller.podwrites import PodWrites
from torchrun_operator.controller.reads import CacheReads
from torchrun_operator.controller.state import Obj
from torchrun_operator.controller.statuswrite import JobGone, StatusWrites
from torchrun_operator.kube import events
from torchrun_operator.kube.cache import JobKey, same_version
from torchrun_operator.kube.client import is_slow, retry_after
from torchrun_operator.kube.jobwatch import JobWatcher
from torchrun_operator.kube.kueue import WorkloadWatcher
from torchrun_operator.kube.leader import RETRY_PERIOD_SECONDS, FencedError
from torchrun_operator.kube.podwatch import PodWatcher, Watcher
from torchrun_operator.reconcile import Plan, reconcile, runtimeref

# The controller's one logger (torchrun_operator.controller), whichever part logs.
log = logging.getLogger(__package__)

# How long stop() waits for reconciles in flight. It closes the gate first, so no write leaves
# after that. A write already sent may be waiting for a slow apiserver up to its deadline
# (kube/leader.write_deadline): the elector releases the Lease only once each is answered or
# given up on (Gate.quiet), so this wait is for a tidy exit, not for safety; 5 s sees a
# healthy control plane's writes answered. The reads a reconcile may be waiting on (30 s)
# are not waited for: a read changes nothing.
STOP_GRACE_SECONDS = 5.0


def _namespace_terminating(e: ApiException) -> bool:
    return e.status == 403 and "NamespaceTerminating" in str(e.body or "")


def _describe(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"API error {e.status} {e.reason}"
    return type(e).__name__


class Controller(PodWrites, StatusWrites, KueueSync, CacheReads):
    """The watches, the workers and the reconcile of one job (sync, then _apply), over the
    parts it joins: each adds the methods of one concern to the state of state.py."""

    # -- wiring ------------------------------------------------------------------------------

    def start(self) -> None:
        for ns in self._namespaces:
            watchers: list[Watcher] = [
                JobWatcher(self.api, self.jobs, self.on_job_event, ns),
                PodWatcher(self.api, self.pods, self.enqueue, ns),
            ]
            if self.kueue is not None:
                watchers.append(WorkloadWatcher(self.api, self.workloads, self.enqueue, ns))
            for w in watchers:
                w.start()
            self._watchers += watchers
        for i in range(self._workers):
            t = threading.Thread(target=self._work, name=f"worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._phases_loop, name="phases", daemon=True).start()
        if self.rankmap is not None:
            self.rankmap.start()
        metrics.set_status_source(self._running_jobs)

    def dead_threads(self) -> list[str]:
        """Names of worker and watch threads that died; the liveness probe fails on any."""
        threads = [*self._threads, *(w.thread for w in self._watchers)]
        if self.rankmap is not None and self.rankmap.thread.ident is not None:
            threads.append(self.rankmap.thread)
        if self._stopped.is_set():
            return []
        return [t.name for t in threads if not t.is_alive()]

    def stop(self) -> None:
        """Stops taking work and waits (bounded) for reconciles in flight, so that nothing
        of ours writes after it returns: the lease is released only then."""
        self.gate.close()  # first: no write leaves from here on, whatever is in flight
        self.active.clear()
        self.queue.shutdown()
        for w in self._watchers:
            w.stop()
        if self.rankmap is not None:
            self.rankmap.stop()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._events.shutdown(wait=False, cancel_futures=True)
        self._stopped.set()

    def set_active(self, active: bool) -> None:
        if active:
            self.active.set()
            for key in self.jobs.keys():  # noqa: SIM118 - a method, not a dict
                self.queue.add(key)
        else:
            self.active.clear()
        self._publish_phases()

    def on_job_event(self, kind: str, job: Obj) -> None:
        """A job's watch event (kube/jobwatch.py): ADDED, MODIFIED or DELETED."""
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        if kind == "DELETED":
            self._forget(key, meta.get("uid", ""))
            self._publish_phases()
            return
        # The echo of our own status write: the cache has held this very version since the
        # write's answer (_patch_status), and the reconcile that wrote it planned what comes
        # next (a pod event during it ran it again). Deciding once more from the same job and
        # the same pods would change nothing; with many jobs it was every other reconcile.
        echo = same_version(self.jobs.get(key), job)
        self.jobs.put(job)
        self._publish_phases()
        if not echo:
            self.queue.add(key)

    def _forget(self, key: JobKey, uid: str) -> None:
        self.jobs.remove(key)
        self._views.pop(key, None)
        self._children_done.discard(uid)
        self._conflicts.pop(uid, None)
        self._refused.pop(uid, None)
        self._invalid_status.pop(uid, None)
        self.queue.succeeded(key)  # its failures in a row: a new job of the name has none
        self._admitted.pop(uid, None)
        self._unread.pop(uid, None)
        self._gang.forget(uid)
        if self.rankmap is not None:
            self.rankmap.forget(key)
        self._publish_phases()

    # -- the work loop -----------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stopped.is_set():
            key = self.queue.get()
            if key is None:
                return
            self.process(key)

    def process(self, key: Any) -> None:
        """One key from the queue: reconciled, and on a failure added back after its
        back-off (kube/workqueue.py), which a success resets; after a try the apiserver was
        too slow for (kube/client.is_slow), within seconds, the back-off left as it is."""
        try:
            # A standby replica drops keys: set_active() re-queues every job on takeover.
            if self.active.is_set():
                self.sync(key)
            self.queue.succeeded(key)
        except FencedError as e:
            # Our term ended mid-reconcile: the writes it had left were not sent. Not the
            # job's failure: no back-off. Looked at again once a term could have begun
            # again (a renewal that lands late starts one without a "became leader"); a
            # standby drops it then, and the leader reconciles it.
            log.info("reconcile of %s stopped: %s", key, e)
            self.queue.add(key, after=RETRY_PERIOD_SECONDS)
        except (ApiException, urllib3.exceptions.HTTPError) as e:
            self._api_failed(key, e)
        except Exception:  # noqa: BLE001 - one job's failure must not stop the worker
            delay = self._retry(key)
            log.exception("reconcile of %s failed; retrying in %.1f s", key, delay)
        finally:
            self.queue.done(key)

    def _api_failed(self, key: Any, e: ApiException | urllib3.exceptions.HTTPError) -> None:
        """A reconcile that an API request ended, retried with one log line (never a
        traceback: the cure is a retry). A request the apiserver did not answer in time, or
        answered 429, 503 or 504 (kube/client.is_slow), is no failure of the job: tried
        again within seconds (workqueue.slow_delay), the back-off left as it is; what landed
        is read back then. Any other is the back-off's."""
        if is_slow(e):
            delay = self.queue.add_slow(key, retry_after(e))
            metrics.observe_reconcile(0.0, error=True)
            log.warning(
                "reconcile of %s: the apiserver is slow (%s); trying again in %.1f s",
                key,
                _describe(e),
                delay,
            )
        elif isinstance(e, ApiException):
            # The API said no (a terminating namespace, a conflict, a quota): a retry later.
            delay = self._retry(key)
            quiet = _namespace_terminating(e) or getattr(e, "_said", False)
            log.log(
                logging.INFO if quiet else logging.WARNING,
                "reconcile of %s: API error %s %s; retrying in %.1f s",
                key,
                e.status,
                e.reason,
                delay,
            )
        else:
            # No connection (refused, dropped, not accepted in time: an apiserver restarting
            # or away): the back-off, as for any failure.
            delay = self._retry(key)
            log.warning(
                "reconcile of %s: API unreachable (%s); retrying in %.1f s",
                key,
                type(e).__name__,
                delay,
            )

    def _retry(self, key: Any, at_least: float | None = None) -> float:
        metrics.observe_reconcile(0.0, error=True)
        return self.queue.add_failed(key, at_least or 0.0)

    def _watchers_synced(self) -> bool:
        return all(w.synced.is_set() for w in self._watchers)

    def sync(self, key: JobKey) -> None:
        job = self.jobs.get(key)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        if not self._watchers_synced():
            # Deciding from an empty pod cache would re-create pods that exist.
            self.queue.add(key, after=0.5)
            return
        started = time.monotonic()
        uid = job["metadata"]["uid"]
        # The job as the operator works on it: its spec merged onto the runtime it names, as
        # recorded in its status (read from the API only until it is recorded).
        lookup = runtimeref.needs_lookup(job)
        found = self._runtimes.get(*lookup, job["metadata"]["namespace"]) if lookup else None
        resolved = runtimeref.resolve(job, found)
        work = resolved.job
        self._recheck_conflicts(work)
        # An invalid spec needs no children: the reconciler fails the job (InvalidSpec).
        with contextlib.suppress(ValidationError):
            if not resolved.missing:
                self._ensure_children(work)
        blocked = sorted(self._conflicts.get(uid, {}).values())
        refused = sorted(m for m, _, _ in self._refused.get(uid, {}).values())
        live = self.rankmap.live(key) if self.rankmap is not None else None
        workload = self._workload(work) if self.kueue is not None else None
        priority = self._priority(work, workload)
        admission, rendered_from = self._admission(work, workload, priority)
        plan = reconcile(
            testplant.reconciled_from(rendered_from),
            testplant.visible_pods(job, self.pods.pods(key)),
            self._clock(),
            blocked,
            refused,
            live,
            admission,
            view_of=self._viewer(key),
            runtime=resolved if resolved.runtime is not None else None,
        )
        try:
            # The status written is compared with the job's own: a runtime recorded just now
            # is in `work`'s status only.
            written = self._apply(work, plan, job.get("status") or {})
        except JobGone:
            self._forget(key, uid)
            return
        if written and self.kueue is not None and not resolved.missing:
            # A job waiting for its runtime has no pod template to queue yet.
            self._sync_workload(work, plan, workload, priority)
        if self.rankmap is not None:
            # Which pods to read next: the running pods of the attempt the plan recorded.
            running = plan.status.get("phase") not in (*FINISHED, Phase.SUSPENDED)
            attempt = plan.status.get("attempt")
            pods = self.pods.pods(key) if running else []
            self.rankmap.track(key, pods, attempt, self._status_port(work))
        metrics.observe_reconcile(time.monotonic() - started, error=False)
        testplant.after_reconcile()

    # -- applying a plan: intent first ----------------------------------------------------------

    def _apply(self, job: Obj, plan: Plan, old_status: Obj) -> bool:
        """Status first, then pods. The status carries every decision (phase, attempt, the
        pods each node index should run), so once it is written a crash or a lost response
        changes nothing: the next reconcile derives the same deletes and creates from it. If
        the write is refused (409: the job changed under us), nothing is touched and the job
        is decided again from its current state. True when the plan was carried out."""
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        key = (ns, name)
        if plan.status != old_status:
            if not self._patch_status(job, plan.status):
                return False
            # What the plan decided is counted once it is written, never for a plan that lost
            # a conflict (decided again from the job as it is now) or failed.
            metrics.record_transitions(plan.transitions)
        # Deletes fan out like creates: a 512-pod gang restart must not pay 512 round trips
        # in a row.
        cached = self.pods.pods(key)
        uids = {p["metadata"]["name"]: p["metadata"].get("uid") for p in cached}
        deletes = testplant.deletions(plan.status, plan.delete, cached)
        self._fan_out(lambda n: self._delete_pod(ns, n, uids.get(n)), deletes)
        self._fan_out(lambda n: self._delete_pod(ns, n, uids.get(n), force=True), plan.force_delete)
        creates = self._due_creates(meta["uid"], plan.create)
        if not self._gang_ready(job, plan.status):
            creates = []  # a gang's pods never start without their PodGroup
        if creates:
            # Pods of one job are created concurrently: a 512-node job must not wait for 512
            # round trips one after another.
            for pod, got in zip(
                creates, self._fan_out(lambda p: self._create_pod(job, p), creates), strict=True
            ):
                if isinstance(got, ApiException):
                    self._refuse(job, pod["metadata"]["name"], got)
                    continue
                self._refused.get(meta["uid"], {}).pop(pod["metadata"]["name"], None)
                if got is not None and controller_uid(got) != meta["uid"]:
                    self._conflict(job, got)
                    self.queue.add(key)
                elif got is not None:
                    self.pods.put(got)
            extra = testplant.twin(creates[0])
            if extra is not None:
                self._create_pod(job, extra)
            testplant.after_creates(len(creates))
        for ev in plan.events:
            # Events are for people: fire and forget, so a slow event never delays a job.
            self._events.submit(events.post, self.writes, job, ev.type, ev.reason, ev.message)
        if plan.delete_job or testplant.deleted_early(job, plan.status):
            self._delete_job(job)
            return True
        if plan.requeue_after is not None:
            self.queue.add(key, after=max(plan.requeue_after, 0.05))
        return True
