"""The controller's state and its I/O seams: the API clients, the caches fed by the watches,
the work queue, the thread pools, and what it remembers of each job between reconciles.

The controller's other parts (children.py, podwrites.py, statuswrite.py, kueuesync.py,
reads.py, loop.py) are classes over this one, each adding the methods of one concern; loop.py's
`Controller` joins them. None of them decides: decisions are `reconcile.reconcile`'s.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchrun_operator.kube.cache import JobCache, JobKey, PodCache, slim_pod
from torchrun_operator.kube.client import Writes
from torchrun_operator.kube.gangobjects import GangObjects
from torchrun_operator.kube.kueue import KueueClient
from torchrun_operator.kube.leader import FencedError, Gate
from torchrun_operator.kube.podwatch import Watcher
from torchrun_operator.kube.rankmap import RankMapReader
from torchrun_operator.kube.runtimes import RuntimeReader
from torchrun_operator.kube.workqueue import WorkQueue
from torchrun_operator.reconcile import observe
from torchrun_operator.render.configmap import packaged_launcher
from torchrun_operator.render.networkpolicy import OperatorPeer

Obj = dict[str, Any]
T = TypeVar("T")
R = TypeVar("R")

# "0" turns the live rank map (reading the launchers' status endpoints) off.
ENV_LIVE_STATUS = "TORCHRUN_OPERATOR_LIVE_STATUS"


def ok_codes(e: ApiException, *codes: int) -> bool:
    return e.status in codes


class ControllerState:
    """What every part of the controller works on; loop.py's `Controller` is one."""

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
        # Pods, Services, ConfigMaps and NetworkPolicies go through `writes` (kube/client.py's
        # thin requests), never the generated CoreV1Api: loading it is 21 MiB.
        self.custom = client.CustomObjectsApi(api)
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
        # job uid -> (its Workload's uid, when first seen held back by an unread namespace)
        self._unread: dict[str, tuple[str, float]] = {}
        # Job -> the views of its pods its last reconcile took (controller/reads.py).
        self._views: dict[JobKey, dict[tuple[str, str, str | None], observe.PodView]] = {}

    def _publish_phases(self) -> None:
        # Counting every job on every event would cost O(jobs) per event; a thread folds them.
        self._phases_dirty.set()

    def enqueue(self, key: JobKey) -> None:
        # A short delay gathers a burst of pod events into one reconcile.
        self.queue.add(key, after=self._debounce, urgent=True)

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
