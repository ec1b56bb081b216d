"""The controller: caches fed by watches, a work queue of jobs, and workers that apply plans.

Every decision is made by the pure `reconcile.reconcile`; this module only fetches what it
needs from the caches (and the latest answers of the pods' launcher status endpoints, which
kube/rankmap.py reads), calls it, and carries the plan out against the API. It is
level-triggered: whatever woke a job up, the job is reconciled from the whole observed state.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from torchrun_operator import metrics, testplant
from torchrun_operator.api.names import GROUP, PLURAL, VERSION
from torchrun_operator.api.status_names import FINISHED, Phase
from torchrun_operator.kube import events
from torchrun_operator.kube.cache import JobCache, JobKey, PodCache, same_version, slim_pod
from torchrun_operator.kube.client import (
    WRITE_TIMEOUT_SECONDS,
    Writes,
    api_message,
    get_or_none,
    invalid_fields,
    retry_after,
)
from torchrun_operator.kube.gangobjects import GangObjects, GangRefused
from torchrun_operator.kube.jobwatch import JobWatcher
from torchrun_operator.kube.kueue import KueueClient, WorkloadWatcher
from torchrun_operator.kube.leader import RETRY_PERIOD_SECONDS, FencedError, Gate
from torchrun_operator.kube.podwatch import PodWatcher, Watcher
from torchrun_operator.kube.rankmap import RankMapReader
from torchrun_operator.kube.runtimes import RuntimeReader
from torchrun_operator.kube.workqueue import WorkQueue, backoff_delay
from torchrun_operator.launcher.contract import STATUS_PORT
from torchrun_operator.reconcile import Plan, children, observe, reconcile, runtimeref
from torchrun_operator.reconcile import admission as kueue_admission
from torchrun_operator.reconcile.admission import Admission
from torchrun_operator.render import kueue
from torchrun_operator.render.configmap import packaged_launcher
from torchrun_operator.render.networkpolicy import OperatorPeer
from torchrun_operator.render.ports import status_port

log = logging.getLogger(__name__)

Obj = dict[str, Any]
T = TypeVar("T")
R = TypeVar("R")


# How soon a job blocked by an object that is not its own looks again: the object may be a
# predecessor's child the garbage collector is about to delete.
BLOCKED_RETRY_SECONDS = 5.0
# How long stop() waits for reconciles in flight. It closes the gate first, so no write leaves
# after that; a write already sent is given up on within its timeout (kube/client.py). The
# reads a reconcile may be waiting on (30 s) are not waited for: a read changes nothing.
STOP_GRACE_SECONDS = WRITE_TIMEOUT_SECONDS + 1.0
# A pod create the apiserver refused (Pod Security, a quota, a webhook) is retried after
# 2, 4, 8 ... seconds, at most this long: the cause is usually fixed by a person.
REFUSED_RETRY_MAX_SECONDS = 300.0
# Answers to a pod create that a retry alone will not cure, shown on the job.
REFUSED_CODES = (400, 403, 422)
# Where a refused gang object is kept among the refused creates (no pod has this name).
GANG_KEY = "(gang)"
# "0" turns the live rank map (reading the launchers' status endpoints) off.
ENV_LIVE_STATUS = "TORCHRUN_OPERATOR_LIVE_STATUS"
# Views of cached pods remembered (kube/cache.py keeps each pod object unchanged until a
# newer one replaces it): a reconcile reads every pod of its job, an event changes one.
# Past this many the memo starts afresh; more than the pods of 16 jobs of 512 nodes.
VIEW_MEMO_SIZE = 8192


def controller_uid(obj: Obj) -> str | None:
    """The uid of the object's controller ownerReference: ownership is decided by it alone."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def describe_conflict(job: Obj, obj: Obj) -> str:
    """Why an existing object with a name this job needs cannot be used, for a condition."""
    meta = obj.get("metadata", {})
    what = f"{obj.get('kind') or 'object'} {meta.get('namespace')}/{meta.get('name')}"
    owner = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    if (
        owner is not None
        and owner.get("kind") == job["kind"]
        and owner.get("name") == (job["metadata"]["name"])
    ):
        return f"{what} belongs to a previous job of the same name; waiting for it to be deleted"
    if owner is None:
        return f"{what} exists and has no controller; delete or rename it"
    return f"{what} is controlled by {owner.get('kind')} {owner.get('name')}; not this job's"


class _Gone(Exception):
    """The job is gone (404 on its status): forget it."""


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
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        network_policy: bool = True,
        operator_namespace: str | None = None,
        live_status: bool | None = None,
        kueue: bool = False,
        gate: Gate | None = None,
    ) -> None:
        self.api = api
        # The leadership gate the client's writes pass (kube/leader.py), closed by stop();
        # without one (tests), a gate of our own that nothing else sees.
        self.gate = gate if gate is not None else Gate()
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.net = client.NetworkingV1Api(api)
        self.writes = Writes(api)
        self._network_policy = network_policy  # the default; spec.networkPolicy overrides
        # The jobs' NetworkPolicies admit the operator's pods (the chart sets POD_NAMESPACE)
        # to the launchers' status port; outside a cluster there is no pod to admit.
        ns = operator_namespace or os.environ.get("POD_NAMESPACE")
        self._operator_peer = OperatorPeer(ns) if ns else None
        self.jobs = JobCache()
        self.pods = PodCache(keep=slim_pod)
        self.queue = WorkQueue()
        self._namespaces = namespaces or [None]  # type: ignore[list-item]
        self._workers = workers
        self._pool = ThreadPoolExecutor(create_parallelism, thread_name_prefix="create")
        self._events = ThreadPoolExecutor(4, thread_name_prefix="event")
        self._stopped = threading.Event()
        self._phases_dirty = threading.Event()
        self._debounce = debounce
        self._clock = clock
        self._children_done: set[str] = set()  # job uids whose children exist and are theirs
        # Objects in a job's way (job uid -> kind/name -> why), fed to the reconciler so the
        # job says what blocks it instead of retrying in silence.
        self._conflicts: dict[str, dict[str, str]] = {}
        # Pod creates the apiserver refused: job uid -> pod name -> (message, retry at, tries).
        self._refused: dict[str, dict[str, tuple[str, float, int]]] = {}
        # Job uid -> what the apiserver said when it refused our status write as invalid
        # (422): said once, in an Event and a log line, not at every retry.
        self._invalid_status: dict[str, str] = {}
        self._launcher = packaged_launcher()
        self._gang = GangObjects(api)  # spec.scheduling.gang: the attempts' PodGroups
        self._runtimes = RuntimeReader(api)  # spec.runtimeRef, read until recorded
        self._threads: list[threading.Thread] = []
        self._watchers: list[Watcher] = []
        # The live rank map: the launchers' status endpoints, read by their pod IPs. Off with
        # TORCHRUN_OPERATOR_LIVE_STATUS=0 (then the status learns ranks when pods end).
        if live_status is None:
            live_status = os.environ.get(ENV_LIVE_STATUS, "1") != "0"
        self.rankmap = RankMapReader(self.enqueue) if live_status else None
        self.active = threading.Event()  # set while this replica leads
        self._phases_lock = threading.Lock()
        # Kueue (--kueue): jobs labelled kueue.x-k8s.io/queue-name wait for their Workload's
        # admission. Off, the label means nothing to the operator.
        self.kueue = KueueClient(api) if kueue else None
        self.workloads = PodCache()  # our Workloads, by job (they carry the job label)
        # Job uid -> (Workload resourceVersion, what its admission puts into the pods).
        self._admitted: dict[str, tuple[str, Obj]] = {}
        # id(pod) -> (the pod, the trainer's name, its view): by identity, holding the pod
        # so that its id cannot be reused while remembered.
        self._views: dict[int, tuple[Obj, str | None, observe.PodView]] = {}

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

    def _running_jobs(self) -> list[Obj]:
        """The jobs the progress metrics are taken from at scrape time (the leader's only)."""
        if not self.active.is_set():
            return []
        return [j for k in self.jobs.keys() if (j := self.jobs.get(k)) is not None]  # noqa: SIM118

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
        self._children_done.discard(uid)
        self._conflicts.pop(uid, None)
        self._refused.pop(uid, None)
        self._invalid_status.pop(uid, None)
        self.queue.succeeded(key)  # its failures in a row: a new job of the name has none
        self._admitted.pop(uid, None)
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
        back-off (kube/workqueue.py), which a success resets."""
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
        except ApiException as e:
            # The API said no (a terminating namespace, a conflict, a quota): a retry
            # later is the cure, a traceback would only be noise. A 429 or 503 says when.
            delay = self._retry(key, retry_after(e))
            quiet = _namespace_terminating(e) or getattr(e, "_said", False)
            log.log(
                logging.INFO if quiet else logging.WARNING,
                "reconcile of %s: API error %s %s; retrying in %.1f s",
                key,
                e.status,
                e.reason,
                delay,
            )
        except urllib3.exceptions.HTTPError as e:
            # The apiserver did not answer in time or the connection dropped (a busy control
            # plane, a restart): transient like a 503, so one line, not a traceback.
            delay = self._retry(key)
            log.warning(
                "reconcile of %s: API unreachable (%s); retrying in %.1f s",
                key,
                type(e).__name__,
                delay,
            )
        except Exception:  # noqa: BLE001 - one job's failure must not stop the worker
            delay = self._retry(key)
            log.exception("reconcile of %s failed; retrying in %.1f s", key, delay)
        finally:
            self.queue.done(key)

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
            view_of=self._view,
            runtime=resolved if resolved.runtime is not None else None,
        )
        try:
            # The status written is compared with the job's own: a runtime recorded just now
            # is in `work`'s status only.
            written = self._apply(work, plan, job.get("status") or {})
        except _Gone:
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

    @staticmethod
    def _status_port(job: Obj) -> int:
        """The port the job's launchers answer on (render/ports.py); the contract's for a
        spec the model refuses (its pods, if any, were rendered so)."""
        try:
            return status_port(job)
        except ValidationError:
            return STATUS_PORT

    def _view(self, pod: Obj, trainer: str | None) -> observe.PodView:
        """observe.view, remembered per cached pod object (the cache never changes one)."""
        got = self._views.get(id(pod))
        if got is not None and got[0] is pod and got[1] == trainer:
            return got[2]
        v = observe.view(pod, trainer)
        if len(self._views) >= VIEW_MEMO_SIZE:
            self._views.clear()
        self._views[id(pod)] = (pod, trainer, v)
        return v

    # -- Kueue: the job's Workload (reconcile/admission.py decides) ------------------------------

    def _workload(self, job: Obj) -> Obj | None:
        """The job's own Workload (controller uid) from the watch's cache, None if none."""
        meta = job["metadata"]
        ours = [
            w
            for w in self.workloads.pods((meta["namespace"], meta["name"]))
            if controller_uid(w) == meta["uid"]
        ]
        return next((w for w in ours if not w["metadata"].get("deletionTimestamp")), None)

    def _priority(self, job: Obj, workload: Obj | None) -> int | None:
        """The value of the job's WorkloadPriorityClass, read only while it has no Workload
        (the priority is fixed when the Workload is created)."""
        name = kueue.priority_class(job)
        if self.kueue is None or workload is not None or name is None:
            return None
        value = self.kueue.priority(name)
        if value is None:
            # Nothing watches WorkloadPriorityClasses: look again for the one it names.
            meta = job["metadata"]
            self.queue.add((meta["namespace"], meta["name"]), after=BLOCKED_RETRY_SECONDS)
        return value

    def _admission(
        self, job: Obj, workload: Obj | None, priority: int | None
    ) -> tuple[Admission | None, Obj]:
        """What Kueue says (None: not queued through it), and the job to render pods from:
        once admitted, with what admission puts into the pods (the assigned flavors' node
        labels and tolerations), read once per Workload change."""
        if self.kueue is None:
            return None, job
        verdict = kueue_admission.admission(job, workload, priority)
        if verdict is None or not verdict.admitted or workload is None:
            return verdict, job
        uid, rv = job["metadata"]["uid"], workload["metadata"].get("resourceVersion", "")
        cached = self._admitted.get(uid)
        if cached is None or cached[0] != rv:
            flavors = self.kueue.flavors(kueue.assigned_flavors(workload))
            cached = (rv, kueue.pod_set_info(workload, flavors))
            self._admitted[uid] = cached
        return verdict, kueue.with_pod_set_info(job, cached[1])

    def _sync_workload(
        self, job: Obj, plan: Plan, workload: Obj | None, priority: int | None
    ) -> None:
        """After the job's status is written: create, replace, (de)activate, release or finish
        its Workload, as decided from that status and the pods that are left."""
        assert self.kueue is not None
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        pods = self.pods.pods(key)
        now = self._clock().timestamp()
        actions = kueue_admission.workload_actions(job, plan.status, workload, pods, now, priority)
        for action in actions:
            log.info("job %s/%s: workload %s (%s)", *key, action.kind, action.why or "-")
            got = self.kueue.apply(meta["namespace"], workload, action)
            if got is None:
                continue
            if controller_uid(got) != meta["uid"]:
                self._conflict(job, got)  # a Workload of that name that is not the job's
                self.queue.add(key)
            else:
                # As the API answered: the next reconcile need not wait for the watch.
                self.workloads.put(got)

    # -- children: created idempotently, used only when they are this job's ----------------------

    def _ensure_children(self, job: Obj) -> None:
        uid = job["metadata"]["uid"]
        if uid in self._children_done:
            return
        ns = job["metadata"]["namespace"]
        objs = children(job, self._launcher, self._network_policy, self._operator_peer)
        # Created at once, not one round trip after another: they do not depend on each
        # other, and a new job's pods wait for them. list() re-raises the first error.
        found = self._fan_out(lambda obj: self._create(ns, obj), objs)
        ok = True
        for existing in found:
            if existing is not None and controller_uid(existing) != uid:
                self._conflict(job, existing)
                ok = False
        if ok:
            self._children_done.add(uid)

    def _fan_out(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """`fn` over `items` on the pool at once; the results in order. Once one raises, those
        not started yet are cancelled (after a fence, none would be sent anyway: the gate
        refuses each) and the error is raised when the started ones are done: a FencedError
        first (the reconcile stops, no failure), else the first in order."""
        futures = [self._pool.submit(fn, item) for item in items]
        _, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
        if errors:
            raise next((e for e in errors if isinstance(e, FencedError)), errors[0])
        return [f.result() for f in futures]

    def _conflict(self, job: Obj, obj: Obj) -> None:
        uid = job["metadata"]["uid"]
        kind, name = obj.get("kind") or "", obj["metadata"]["name"]
        self._conflicts.setdefault(uid, {})[f"{kind}/{name}"] = describe_conflict(job, obj)

    def _recheck_conflicts(self, job: Obj) -> None:
        """Objects that were in the way: gone, or ours now (re-created by us), unblock."""
        uid = job["metadata"]["uid"]
        ns = job["metadata"]["namespace"]
        for ref in list(self._conflicts.get(uid) or ()):
            kind, name = ref.split("/", 1)
            current = self._read(ns, kind, name)
            if current is None or controller_uid(current) == uid:
                self._conflicts[uid].pop(ref, None)
                if kind != "Pod":
                    self._children_done.discard(uid)  # create it now that the way is free
        if not self._conflicts.get(uid):
            self._conflicts.pop(uid, None)

    def _read(self, ns: str, kind: str, name: str) -> Obj | None:
        fn: Any = {
            "Pod": self.core.read_namespaced_pod,
            "Service": self.core.read_namespaced_service,
            "ConfigMap": self.core.read_namespaced_config_map,
            "NetworkPolicy": self.net.read_namespaced_network_policy,
            "Workload": lambda name, ns, **kw: self.custom.get_namespaced_custom_object(
                kueue.GROUP, kueue.VERSION, ns, kueue.WORKLOADS, name, **kw
            ),
        }[kind]
        resp = get_or_none(kind, lambda: fn(name, ns, _preload_content=False))
        if resp is None:
            return None
        got: Obj = json.loads(resp.data)
        got.setdefault("kind", kind)
        return got

    def _create(self, ns: str, obj: Obj) -> Obj | None:
        """Creates `obj`; on 409 returns the object that holds the name (for an owner check),
        else None."""
        kind = obj["kind"]
        try:
            created: Obj = self.writes.create(ns, obj)
            metrics.count_api_call("create", kind.lower(), 201)
            if kind == "Pod":
                self.pods.put(created)
            return None
        except ApiException as e:
            metrics.count_api_call("create", kind.lower(), e.status or 0)
            if not _ok_codes(e, 409):
                raise
        existing = self._read(ns, kind, obj["metadata"]["name"])
        if existing is None:
            raise ApiException(status=409, reason=f"{kind} {obj['metadata']['name']} conflict")
        return existing

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
        uids = {p["metadata"]["name"]: p["metadata"].get("uid") for p in self.pods.pods(key)}
        self._fan_out(lambda n: self._delete_pod(ns, n, uids.get(n)), plan.delete)
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
        if plan.delete_job:
            self._delete_job(job)
            return True
        if plan.requeue_after is not None:
            self.queue.add(key, after=max(plan.requeue_after, 0.05))
        return True

    def _gang_ready(self, job: Obj, status: Obj) -> bool:
        """The attempt's gang objects exist (kube/gangobjects.py, after the status naming
        them is written); a refusal is shown on the job like a refused pod, and retried."""
        uid = job["metadata"]["uid"]
        refused = self._refused.get(uid, {})
        if refused.get(GANG_KEY, ("", 0.0, 0))[1] > time.monotonic():
            return False
        try:
            self._gang.sync(job, status)
        except GangRefused as e:
            self._note_refused(job, GANG_KEY, str(e))
            return False
        if refused.pop(GANG_KEY, None) is not None:
            self.queue.add((job["metadata"]["namespace"], job["metadata"]["name"]))
        return True

    def _create_pod(self, job: Obj, pod: Obj) -> Obj | ApiException | None:
        """Like _create; a refusal that a retry will not cure is returned, not raised."""
        try:
            return self._create(job["metadata"]["namespace"], pod)
        except ApiException as e:
            if e.status in REFUSED_CODES:
                return e
            raise

    def _due_creates(self, uid: str, pods: list[Obj]) -> list[Obj]:
        """Drops creates the apiserver refused whose back-off has not passed yet."""
        refused = self._refused.get(uid)
        if not refused:
            return pods
        now = time.monotonic()
        return [p for p in pods if refused.get(p["metadata"]["name"], ("", 0.0, 0))[1] <= now]

    def _refuse(self, job: Obj, name: str, e: ApiException) -> None:
        self._note_refused(job, name, f"creating Pod {name} refused ({e.status}): {api_message(e)}")

    def _note_refused(self, job: Obj, what: str, message: str) -> None:
        """A create of `what` (a pod's name, or GANG_KEY) was refused: shown on the job, and
        tried again after 2, 4, 8 ... seconds (the queue's back-off, without jitter), at
        most REFUSED_RETRY_MAX_SECONDS."""
        uid = job["metadata"]["uid"]
        _, _, tries = self._refused.get(uid, {}).get(what, ("", 0.0, 0))
        delay = backoff_delay(tries + 1, cap=REFUSED_RETRY_MAX_SECONDS)
        self._refused.setdefault(uid, {})[what] = (message, time.monotonic() + delay, tries + 1)
        log.warning("%s; retrying in %.0fs", message, delay)
        meta = job["metadata"]
        self.queue.add((meta["namespace"], meta["name"]), after=delay)

    def _delete_pod(self, ns: str, name: str, uid: str | None) -> None:
        """Deletes exactly the pod the plan was made from: the uid precondition makes a pod
        that someone re-created under the name since (409) safe."""
        try:
            body = self.writes.delete_pod(ns, name, uid)
            metrics.count_api_call("delete", "pod", 200)
            if body.get("kind") == "Pod":
                # Now carries deletionTimestamp; unless the watch already saw it deleted.
                self.pods.put_if_cached(body)
        except ApiException as e:
            metrics.count_api_call("delete", "pod", e.status or 0)
            if not _ok_codes(e, 404, 409):
                raise

    def _patch_status(self, job: Obj, status: Obj) -> bool:
        """Writes the whole status if the job is still at the resourceVersion it was decided
        from; True when written. On 409 the job is re-read and decided again; on 404 it is
        forgotten (raises _Gone)."""
        meta = job["metadata"]
        # "add" on /status replaces it whole: fields that went away (a cleared failure) go too,
        # which a merge patch would keep. The resourceVersion in the patched object makes the
        # apiserver refuse the write (409) if anyone wrote the job since we read it.
        patch: list[Obj] = [{"op": "add", "path": "/status", "value": status}]
        if meta.get("resourceVersion"):
            patch.insert(
                0,
                {
                    "op": "replace",
                    "path": "/metadata/resourceVersion",
                    "value": meta["resourceVersion"],
                },
            )
        try:
            written: Obj = self.writes.patch_status(
                GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], patch
            )
            metrics.count_api_call("patch", "distributedtrainingjob/status", 200)
        except ApiException as e:
            metrics.count_api_call("patch", "distributedtrainingjob/status", e.status or 0)
            if _ok_codes(e, 404):
                raise _Gone from e
            if _ok_codes(e, 409):
                self._reread(job)
                return False
            if _ok_codes(e, 422):
                self._status_invalid(job, e)
            raise
        self._invalid_status.pop(meta["uid"], None)
        self.jobs.put(written)
        self._publish_phases()
        return True

    def _status_invalid(self, job: Obj, e: ApiException) -> None:
        """The apiserver found the status we wrote invalid (422): a bug in us, not in the job
        (or an admission policy of the cluster's that refuses it), and the same status would be
        refused again. Said once, in a log line and an Event naming the fields; the worker
        retries it after its back-off (to the cap), quietly."""
        meta = job["metadata"]
        fields = invalid_fields(e)
        where = ", ".join(fields) if fields else "a field it did not name"
        what = f"the apiserver refused this job's status as invalid at {where}: {api_message(e)}"
        e._said = True  # type: ignore[attr-defined] # the worker's own line: no warning again
        if self._invalid_status.get(meta["uid"]) == what:
            return
        self._invalid_status[meta["uid"]] = what
        log.error(
            "job %s/%s: %s (a bug in torchrun-operator, unless an admission policy of this"
            " cluster refused it; retrying with back-off)",
            meta["namespace"],
            meta["name"],
            what,
        )
        self._events.submit(events.post, self.writes, job, "Warning", "StatusInvalid", what)

    def _reread(self, job: Obj) -> None:
        """After a conflict: the current job into the cache, and decide again at once."""
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        try:
            fresh: Any = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], PLURAL, meta["name"]
            )
            metrics.count_api_call("get", "distributedtrainingjob", 200)
        except ApiException as e:
            metrics.count_api_call("get", "distributedtrainingjob", e.status or 0)
            if _ok_codes(e, 404):
                raise _Gone from e
            raise
        if fresh["metadata"].get("uid") != meta.get("uid"):
            raise _Gone  # deleted and re-created under the same name: a new job
        self.jobs.put(fresh)
        self.queue.add(key)

    def _delete_job(self, job: Obj) -> None:
        """TTL: delete exactly this job; a job re-created under its name has another uid."""
        meta = job["metadata"]
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=meta["uid"]))
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], body=body
            )
            metrics.count_api_call("delete", "distributedtrainingjob", 200)
        except ApiException as e:
            metrics.count_api_call("delete", "distributedtrainingjob", e.status or 0)
            if not _ok_codes(e, 404, 409):
                raise
