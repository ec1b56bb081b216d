"""The controller: caches fed by watches, a work queue of jobs, and workers that apply plans.

Every decision is made by the pure `reconcile.reconcile`; this module only fetches what it
needs from the caches, calls it, and carries the plan out against the API. It is
level-triggered: whatever woke a job up, the job is reconciled from the whole observed state.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchrun_operator import metrics
from torchrun_operator.api.names import GROUP, PLURAL, VERSION
from torchrun_operator.kube import events
from torchrun_operator.kube.cache import JobCache, JobKey, PodCache
from torchrun_operator.kube.podwatch import PodWatcher
from torchrun_operator.kube.workqueue import WorkQueue
from torchrun_operator.reconcile import Plan, children, reconcile

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def launcher_source() -> str:
    return resources.files("torchrun_operator.launcher").joinpath("launcher.py").read_text()


def _ok_codes(e: ApiException, *codes: int) -> bool:
    return e.status in codes


def _namespace_terminating(e: ApiException) -> bool:
    return e.status == 403 and "NamespaceTerminating" in str(e.body or "")


class Controller:
    def __init__(
        self,
        api: client.ApiClient,
        namespaces: list[str] | None = None,
        workers: int = 16,
        create_parallelism: int = 16,
        debounce: float = 0.05,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.jobs = JobCache()
        self.pods = PodCache()
        self.queue = WorkQueue()
        self._namespaces = namespaces or [None]  # type: ignore[list-item]
        self._workers = workers
        self._pool = ThreadPoolExecutor(create_parallelism, thread_name_prefix="create")
        self._events = ThreadPoolExecutor(4, thread_name_prefix="event")
        self._stopped = threading.Event()
        self._phases_dirty = threading.Event()
        self._debounce = debounce
        self._children_done: set[str] = set()  # job uids whose Service+ConfigMap exist
        self._launcher = launcher_source()
        self._threads: list[threading.Thread] = []
        self._watchers: list[PodWatcher] = []
        self.active = threading.Event()  # set while this replica leads
        self._phases_lock = threading.Lock()

    # -- wiring ------------------------------------------------------------------------------

    def start(self) -> None:
        for ns in self._namespaces:
            w = PodWatcher(self.api, self.pods, self.enqueue, ns)
            w.start()
            self._watchers.append(w)
        for i in range(self._workers):
            t = threading.Thread(target=self._work, name=f"worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._phases_loop, name="phases", daemon=True).start()

    def dead_threads(self) -> list[str]:
        """Names of worker and watch threads that died; the liveness probe fails on any."""
        threads = [*self._threads, *(w.thread for w in self._watchers)]
        if self._stopped.is_set():
            return []
        return [t.name for t in threads if not t.is_alive()]

    def stop(self) -> None:
        self.queue.shutdown()
        for w in self._watchers:
            w.stop()
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

    def _publish_phases(self) -> None:
        # Counting every job on every event would cost O(jobs) per event; a thread folds them.
        self._phases_dirty.set()

    def _phases_loop(self) -> None:
        while not self._stopped.wait(1.0):
            if self._phases_dirty.is_set():
                self._phases_dirty.clear()
                self._count_phases()

    def _count_phases(self) -> None:
        """The jobs-by-phase gauge from the job cache; a standby replica reports none."""
        with self._phases_lock:
            if not self.active.is_set():
                metrics.set_jobs_by_phase({})
                return
            jobs = (self.jobs.get(k) for k in self.jobs.keys())  # noqa: SIM118
            metrics.set_jobs_by_phase(
                metrics.phase_counts((j or {}).get("status") for j in jobs if j is not None)
            )

    def enqueue(self, key: JobKey) -> None:
        # A short delay gathers a burst of pod events into one reconcile.
        self.queue.add(key, after=self._debounce)

    def on_job_event(self, kind: str | None, job: Obj) -> None:
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        if kind == "DELETED":
            self.jobs.remove(key)
            self._children_done.discard(meta.get("uid", ""))
            self._publish_phases()
            return
        self.jobs.put(job)
        self._publish_phases()
        self.queue.add(key)

    # -- the work loop -----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            key = self.queue.get()
            if key is None:
                return
            try:
                # A standby replica drops keys: set_active() re-queues every job on takeover.
                if self.active.is_set():
                    self.sync(key)  # type: ignore[arg-type]
            except ApiException as e:
                # The API said no (a terminating namespace, a conflict, a quota): a retry
                # later is the cure, a traceback would only be noise.
                level = logging.INFO if _namespace_terminating(e) else logging.WARNING
                log.log(
                    level, "reconcile of %s: API error %s %s; retrying", key, e.status, e.reason
                )
                self.queue.add(key, after=2.0)
                metrics.observe_reconcile(0.0, error=True)
            except Exception:  # noqa: BLE001 - one job's failure must not stop the worker
                log.exception("reconcile of %s failed; retrying", key)
                self.queue.add(key, after=2.0)
                metrics.observe_reconcile(0.0, error=True)
            finally:
                self.queue.done(key)

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
        self._ensure_children(job)
        plan = reconcile(job, self.pods.pods(key), dt.datetime.now(dt.UTC))
        self._apply(job, plan)
        metrics.observe_reconcile(time.monotonic() - started, error=False)

    def _ensure_children(self, job: Obj) -> None:
        uid = job["metadata"]["uid"]
        if uid in self._children_done:
            return
        ns = job["metadata"]["namespace"]
        for obj in children(job, self._launcher):
            self._create(ns, obj)
        self._children_done.add(uid)

    def _create(self, ns: str, obj: Obj) -> Obj | None:
        kind = obj["kind"]
        fn: Any = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
        }[kind]
        try:
            resp = fn(ns, obj, _preload_content=False)
            metrics.count_api_call("create", kind.lower(), 201)
            created: Obj = json.loads(resp.data)
            return created
        except ApiException as e:
            metrics.count_api_call("create", kind.lower(), e.status or 0)
            if _ok_codes(e, 409):
                return None
            raise

    def _apply(self, job: Obj, plan: Plan) -> None:
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        key = (ns, name)
        # Deletes fan out like creates: a 512-pod gang restart must not pay 512 round trips
        # in a row. list() waits for all of them and re-raises the first error.
        list(self._pool.map(lambda n: self._delete_pod(ns, n), plan.delete))
        if plan.create:
            # Pods of one job are created concurrently: a 512-node job must not wait for 512
            # round trips one after another.
            for pod in self._pool.map(lambda p: self._create(ns, p), plan.create):
                if pod is not None:
                    self.pods.put(pod)
        old_status = job.get("status") or {}
        if plan.status != old_status:
            self._patch_status(job, plan.status)
        for ev in plan.events:
            # Events are for people: fire and forget, so a slow event never delays a job.
            self._events.submit(events.post, self.core, job, ev.type, ev.reason, ev.message)
        if plan.delete_job:
            self._delete_job(ns, name)
            return
        if plan.requeue_after is not None:
            self.queue.add(key, after=max(plan.requeue_after, 0.05))

    def _delete_pod(self, ns: str, name: str) -> None:
        try:
            resp: Any = self.core.delete_namespaced_pod(name, ns, _preload_content=False)
            metrics.count_api_call("delete", "pod", 200)
            body = json.loads(resp.data)
            if body.get("kind") == "Pod":
                # Now carries deletionTimestamp; unless the watch already saw it deleted.
                self.pods.put_if_cached(body)
        except ApiException as e:
            metrics.count_api_call("delete", "pod", e.status or 0)
            if not _ok_codes(e, 404):
                raise

    def _patch_status(self, job: Obj, status: Obj) -> None:
        meta = job["metadata"]
        # "add" on /status replaces it whole: fields that went away (a cleared failure) go too,
        # which a merge patch would keep.
        patch = [{"op": "add", "path": "/status", "value": status}]
        try:
            resp: Any = self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                meta["namespace"],
                PLURAL,
                meta["name"],
                patch,
                _preload_content=False,
                _content_type="application/json-patch+json",
            )
            metrics.count_api_call("patch", "distributedtrainingjob/status", 200)
        except ApiException as e:
            metrics.count_api_call("patch", "distributedtrainingjob/status", e.status or 0)
            if _ok_codes(e, 404):
                return
            raise
        metrics.record_status_change(
            metrics.status_change(job.get("status"), status, meta.get("creationTimestamp"))
        )
        self.jobs.put(json.loads(resp.data))
        self._publish_phases()

    def _delete_job(self, ns: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            metrics.count_api_call("delete", "distributedtrainingjob", 200)
        except ApiException as e:
            metrics.count_api_call("delete", "distributedtrainingjob", e.status or 0)
            if not _ok_codes(e, 404):
                raise
