"""Watches our DistributedTrainingJobs and hands every change to the controller.

kopf used to do this, and its per-event machinery (causes, the diff base, handler
invocation, its own JSON decoding of each job) was the largest part of the operator's CPU
with many jobs (bench/README.md, the profile). This is the pod watch's loop
(kube/podwatch.py) over the jobs: one decode per event, the same back-off and re-list, its
requests through our client (timeouts, fault injection); and a re-list says which jobs were
deleted while the watch was down, which kopf never told us.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from torchrun_operator.api.names import GROUP, PLURAL, VERSION
from torchrun_operator.kube.cache import JobCache, gone_after_relist, parse_rv
from torchrun_operator.kube.client import custom_collection, lister
from torchrun_operator.kube.podwatch import Watcher

Obj = dict[str, Any]
DELETED = "DELETED"


class JobWatcher(Watcher):
    """`on_event(kind, job)` for every ADDED, MODIFIED and DELETED job in the scope. After a
    re-list, every listed job is handed over as ADDED, and a cached job the listing lacks (or
    holds under another uid: deleted and re-created) as DELETED, unless the cache's copy is
    newer than the listing (then it is not the listing's to judge)."""

    what = "job watch"

    def __init__(
        self,
        api: client.ApiClient,
        cache: JobCache,
        on_event: Callable[[str, Obj], None],
        namespace: str | None = None,
    ) -> None:
        super().__init__(namespace, f"jobwatch-{namespace or 'all'}")
        self._api = api
        self._cache = cache
        self._on_event = on_event

    def _list_fn(self) -> Callable[..., Any]:
        return lister(self._api, custom_collection(GROUP, VERSION, PLURAL, self._namespace))

    def _relisted(self, items: list[Obj], resource_version: str) -> None:
        listed = {(i["metadata"]["namespace"], i["metadata"]["name"]): i for i in items}
        at = parse_rv(resource_version)
        for key in self._cache.keys():  # noqa: SIM118 - a method, not a dict
            cached = self._cache.get(key)
            if cached is None or (self._namespace is not None and key[0] != self._namespace):
                continue
            if gone_after_relist(cached, listed.get(key), at):
                self._on_event(DELETED, cached)
        for item in items:
            self._on_event("ADDED", item)

    def _changed(self, kind: str, obj: Obj) -> None:
        self._on_event(kind, obj)
