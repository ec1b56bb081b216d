"""The fault campaign's watch (tests/integration/faultrun.py): every event of a run's pods,
which the invariants (tests/campaign_invariants.py) are checked on."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import campaign_evidence as evidence
import campaign_invariants as inv
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException


class PodMonitor:
    """Records every event of the namespace's pods, from before the job exists. A watch the
    apiserver broke (restarted) is opened again from the last resourceVersion seen, so no
    event is missed. A restarted apiserver's watch cache starts empty and answers that with
    410: then the pods are listed again and the difference recorded as events
    (relist_events); what came and went while the apiserver was down is lost to the
    checks, which can then miss a violation but not invent one."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = ns
        self.events: list[inv.PodEvent] = []
        self.timeline: list[dict[str, Any]] = []  # campaign_evidence.pod_line per event
        self.broke: list[str] = []
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()
        self._stopping = False
        self._live: dict[str, dict[str, Any]] = {}  # uid -> the pod as last seen
        self.relists = 0

    def __enter__(self) -> PodMonitor:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        self._watch.stop()
        self._thread.join(5)

    def _run(self) -> None:
        try:
            self._stream()
        except Exception as e:  # noqa: BLE001 - stop() closes the stream under us
            if not self._stopping:
                self.broke.append(f"pod monitor broke: {e!r} {e}"[:500])

    def _record(self, type_: str, raw: dict[str, Any]) -> None:
        self.events.append(inv.PodEvent.of(type_, raw))
        self.timeline.append(evidence.pod_line(type_, raw))
        uid = raw["metadata"]["uid"]
        if type_ == "DELETED":
            self._live.pop(uid, None)
        else:
            self._live[uid] = raw

    def _list(self) -> str:
        """Records the pods listed as events (none but the first time, when there are no
        pods yet) and returns the list's resourceVersion."""
        listed: Any = self.core.list_namespaced_pod(self.ns, _preload_content=False)
        body = json.loads(listed.data)
        for type_, raw in relist_events(self._live, body.get("items") or []):
            self._record(type_, raw)
        rv: str = body["metadata"]["resourceVersion"]
        return rv

    def _stream(self) -> None:
        rv = self._list()
        self._started.set()
        while not self._stopping:
            try:
                for event in self._watch.stream(
                    self.core.list_namespaced_pod, self.ns, resource_version=rv,
                    timeout_seconds=900,
                ):  # fmt: skip
                    raw = event["raw_object"]  # an ERROR event raises ApiException
                    self._record(event["type"], raw)
                    rv = raw["metadata"]["resourceVersion"]
            except ApiException as e:
                if e.status != 410:
                    raise
                self.relists += 1
                rv = self._list()
            except (urllib3.exceptions.HTTPError, OSError):
                if self._stopping:
                    return
                time.sleep(1)  # the apiserver went away: watch again from where we were


def relist_events(
    live: dict[str, dict[str, Any]], items: list[dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """The watch events that take a pod watch from the pods it knows (`live`, by uid) to
    those listed: the ones gone are DELETED first (so no pod seems to be created beside one
    that had already gone), then the new ones ADDED in the order of their creation, and
    those that changed MODIFIED."""
    listed = {p["metadata"]["uid"]: p for p in items}
    out = [("DELETED", p) for uid, p in live.items() if uid not in listed]
    fresh = [p for uid, p in listed.items() if uid not in live]
    fresh.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
    out += [("ADDED", p) for p in fresh]
    out += [
        ("MODIFIED", p)
        for uid, p in listed.items()
        if uid in live
        and p["metadata"].get("resourceVersion") != live[uid]["metadata"].get("resourceVersion")
    ]
    return out
