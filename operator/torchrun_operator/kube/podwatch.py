"""The watch loop (`Watcher`), and the watch of our pods, and only ours, through a label
selector (`PodWatcher`).

kopf sends no label selector, so a kopf pod handler would stream every pod in the cluster.
The pod watcher lists then watches pods carrying the job label, feeds the pod cache and tells
the controller which job changed. A watch the server ends resumes from the last
resourceVersion; 410 Gone (history compacted) and any error cost a re-list, after a back-off
that grows with consecutive failures (kube/backoff.py), so an apiserver in trouble is not
hammered by every replica at once; a 429 or 503 waits at least what its Retry-After asks
(kube/client.retry_after, the controller's rule too). The jobs' watch (kube/jobwatch.py)
and Kueue's Workloads' (kube/kueue.py) run the same loop.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from torchrun_operator.api.names import LABEL_JOB_NAME as JOB_LABEL
from torchrun_operator.kube.backoff import Backoff
from torchrun_operator.kube.cache import JobKey, PodCache
from torchrun_operator.kube.client import (
    WATCH_REQUEST_TIMEOUT,
    WATCH_TIMEOUT_SECONDS,
    collection,
    lister,
    retry_after,
)

log = logging.getLogger(__name__)


class RawWatch(watch.Watch):
    """A watch that hands out each event's object as its JSON decoded, and nothing more.

    The client's Watch finds a model class from the list call's docstring and, for every
    event, encodes the decoded object to JSON again and builds that model from it (a V1Pod
    is a few hundred objects). We only ever read `raw_object`, so that work was pure cost,
    paid for every pod event."""

    def get_return_type(self, func: Any) -> None:
        return None


class Watcher:
    """Lists, then watches, one resource in one scope (a namespace, or all), for as long as
    it runs: a watch the server ends resumes from the last resourceVersion; 410 Gone and any
    error cost a re-list after the back-off. What a listing or an event means is the
    subclass's (`_relisted`, `_changed`)."""

    what = "watch"  # for the log
    selector: str | None = None  # a label selector for the list and the watch

    def __init__(self, namespace: str | None, thread_name: str) -> None:
        self._namespace = namespace
        self._stop = threading.Event()
        self._watch: Any = None  # a RawWatch while streaming (the client is untyped)
        self.backoff = Backoff()
        self.synced = threading.Event()  # set once the first listing is in
        self.thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _list_fn(self) -> Callable[..., Any]:
        """The list call of our scope (kube/client.lister)."""
        raise NotImplementedError

    def _relisted(self, items: list[dict[str, Any]], resource_version: str) -> None:
        """A fresh listing, taken at `resource_version`: the whole truth then (objects
        missing from it were gone)."""
        raise NotImplementedError

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED or DELETED)."""
        raise NotImplementedError

    def _selector(self) -> dict[str, Any]:
        return {"label_selector": self.selector} if self.selector else {}

    def _list(self) -> dict[str, Any]:
        kw: dict[str, Any] = {**self._selector(), "_preload_content": False}
        resp = self._list_fn()(**kw)
        listed: dict[str, Any] = json.loads(resp.data)
        return listed

    def _events(self, resource_version: str) -> Iterator[dict[str, Any]]:
        """The watch's events from `resource_version` on, until the server ends it."""
        self._watch = RawWatch()  # type: ignore[no-untyped-call]
        kw: dict[str, Any] = {
            **self._selector(),
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": WATCH_TIMEOUT_SECONDS,
            "_request_timeout": WATCH_REQUEST_TIMEOUT,
        }
        yield from self._watch.stream(self._list_fn(), **kw)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _run(self) -> None:
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listed = self._list()
                    at = listed["metadata"]["resourceVersion"]
                    self._relisted(listed.get("items") or [], at)
                    self.synced.set()
                    resource_version = at
                # A watch the server ends (timeoutSeconds) resumes where it stopped.
                resource_version = self._stream(resource_version)
            except Exception as e:  # noqa: BLE001 - the watcher must outlive any one failure
                resource_version = None
                if self._stop.is_set():
                    return  # the connection was closed under us on shutdown
                delay = self.backoff.next()
                gone = isinstance(e, ApiException) and e.status == 410
                if gone and self.backoff.streak == 1:
                    delay = 0.0  # routine history compaction: re-list at once, unless it repeats
                asked = retry_after(e)
                if asked is not None:
                    delay = max(delay, asked)
                log.log(
                    logging.INFO if gone else logging.WARNING,
                    "%s: %s; re-listing in %.1f s",
                    self.what,
                    _describe(e),
                    delay,
                )
                self._sleep(delay)

    def _stream(self, resource_version: str) -> str:
        """Feeds events to `_changed` until the server ends the watch; returns the last
        resourceVersion seen."""
        for event in self._events(resource_version):
            if self._stop.is_set():
                break
            kind, obj = event["type"], event["raw_object"]
            if kind == "ERROR":
                code = obj.get("code")
                raise ApiException(status=code, reason=obj.get("message"))
            resource_version = obj.get("metadata", {}).get("resourceVersion") or resource_version
            if kind == "BOOKMARK":
                continue
            self._changed(kind, obj)
        return resource_version


class PodWatcher(Watcher):
    """Our pods (the job label's selector) into the pod cache; names each job that changed."""

    what = "pod watch"
    selector = JOB_LABEL
    thread_prefix = "podwatch"

    def __init__(
        self,
        api: client.ApiClient,
        cache: PodCache,
        on_change: Callable[[JobKey], None],
        namespace: str | None = None,
    ) -> None:
        super().__init__(namespace, f"{self.thread_prefix}-{namespace or 'all'}")
        self._api = api
        self._cache = cache
        self._on_change = on_change

    def _list_fn(self) -> Callable[..., Any]:
        return lister(self._api, collection("Pod", self._namespace))

    def _relisted(self, items: list[dict[str, Any]], resource_version: str) -> None:
        # Pods missing from the list were deleted while we were not watching: replace_all
        # forgets them and names their jobs for a reconcile.
        for key in self._cache.replace_all(items):
            self._on_change(key)

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        key = self._cache.remove(obj) if kind == "DELETED" else self._cache.put(obj)
        if key is not None:
            self._on_change(key)


def _describe(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"API error {e.status} {e.reason}"
    return f"{type(e).__name__}: {e}"
