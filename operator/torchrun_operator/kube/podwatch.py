"""Watches our pods, and only ours, through a label selector.

kopf sends no label selector, so a kopf pod handler would stream every pod in the cluster.
This watcher lists then watches pods carrying the job label, feeds the pod cache and tells the
controller which job changed. It re-lists on 410 Gone and on any stream error.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from torchrun_operator.api.names import LABEL_JOB_NAME as JOB_LABEL
from torchrun_operator.kube.cache import JobKey, PodCache

log = logging.getLogger(__name__)


class PodWatcher:
    def __init__(
        self,
        api: client.ApiClient,
        cache: PodCache,
        on_change: Callable[[JobKey], None],
        namespace: str | None = None,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._api = api
        self._cache = cache
        self._on_change = on_change
        self._namespace = namespace
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self.synced = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"podwatch-{namespace or 'all'}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _list_fn(self, kw: dict[str, Any]) -> Any:
        """The list call for our scope; `kw` gains the namespace when there is one."""
        if self._namespace:
            kw["namespace"] = self._namespace
            return self._core.list_namespaced_pod
        return self._core.list_pod_for_all_namespaces

    def _list(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"label_selector": JOB_LABEL, "_preload_content": False}
        resp = self._list_fn(kw)(**kw)
        listed: dict[str, Any] = json.loads(resp.data)
        return listed

    def _run(self) -> None:
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listed = self._list()
                    for key in self._cache.replace_all(listed.get("items", [])):
                        self._on_change(key)
                    self.synced.set()
                    resource_version = listed["metadata"]["resourceVersion"]
                # A watch that times out resumes where it stopped; only 410 Gone (history
                # compacted) or an error costs a full re-list.
                resource_version = self._stream(resource_version)
            except ApiException as e:
                resource_version = None
                if e.status != 410:
                    log.warning("pod watch failed: %s; re-listing", e.reason)
                    self._stop.wait(1)
            except Exception as e:  # noqa: BLE001 - the watcher must outlive any one failure
                resource_version = None
                if self._stop.is_set():
                    return  # the connection was closed under us on shutdown
                log.warning("pod watch broke (%s: %s); re-listing", type(e).__name__, e)
                self._stop.wait(1)

    def _stream(self, resource_version: str) -> str:
        """Feeds events into the cache until the server ends the watch; returns the last
        resourceVersion seen."""
        self._watch = watch.Watch()
        kw: dict[str, Any] = {
            "label_selector": JOB_LABEL,
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": 300,
        }
        for event in self._watch.stream(self._list_fn(kw), **kw):
            if self._stop.is_set():
                break
            kind, obj = event["type"], event["raw_object"]
            if kind == "ERROR":
                code = obj.get("code")
                raise ApiException(status=code, reason=obj.get("message"))
            resource_version = obj.get("metadata", {}).get("resourceVersion") or resource_version
            if kind == "BOOKMARK":
                continue
            key = self._cache.remove(obj) if kind == "DELETED" else self._cache.put(obj)
            if key is not None:
                self._on_change(key)
        return resource_version
