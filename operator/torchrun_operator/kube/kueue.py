"""Kueue I/O: the watch of our Workloads, the ResourceFlavors admission names, and carrying
out what reconcile/admission.py decided for a Workload. Decides nothing.

Our Workloads carry the job label (render/kueue.py), so they are watched through the same
label selector and cached by job like the pods; which one is the job's is decided by its
controller uid, as for every child.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchrun_operator import metrics
from torchrun_operator.kube.client import custom_collection, lister
from torchrun_operator.kube.podwatch import PodWatcher
from torchrun_operator.reconcile.admission import WorkloadAction
from torchrun_operator.render import kueue

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class WorkloadWatcher(PodWatcher):
    """Lists and watches Workloads carrying the job label (the pod watch's loop, back-off and
    re-list, over another resource)."""

    # Until it has listed once, no job is reconciled (as for the pod watch): without Kueue's
    # CRDs the operator waits, saying so.
    what = "workload watch (--kueue: are Kueue's CRDs installed?)"
    thread_prefix = "workloadwatch"

    def _list_fn(self) -> Callable[..., Any]:
        return lister(
            self._api,
            custom_collection(kueue.GROUP, kueue.VERSION, kueue.WORKLOADS, self._namespace),
        )


class KueueClient:
    """Reads ResourceFlavors and writes our Workloads."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)

    def flavors(self, names: list[str]) -> dict[str, Obj]:
        """The named ResourceFlavors; a missing one is left out (Kueue admitted on it, so it
        existed a moment ago; its node labels are then unknown, as Kueue's would be)."""
        out: dict[str, Obj] = {}
        for name in names:
            try:
                got: Any = self.custom.get_cluster_custom_object(
                    kueue.GROUP, kueue.VERSION, kueue.RESOURCE_FLAVORS, name
                )
                metrics.count_api_call("get", "resourceflavor", 200)
            except ApiException as e:
                metrics.count_api_call("get", "resourceflavor", e.status or 0)
                if e.status == 404:
                    continue
                raise
            out[name] = got
        return out

    def priority(self, name: str) -> int | None:
        """The value of the named WorkloadPriorityClass, None if there is none."""
        try:
            got: Any = self.custom.get_cluster_custom_object(
                kueue.GROUP, kueue.VERSION, kueue.PRIORITY_CLASSES, name
            )
            metrics.count_api_call("get", "workloadpriorityclass", 200)
        except ApiException as e:
            metrics.count_api_call("get", "workloadpriorityclass", e.status or 0)
            if e.status == 404:
                return None
            raise
        return int(got.get("value") or 0)

    def apply(self, ns: str, workload: Obj | None, action: WorkloadAction) -> Obj | None:
        """Carries out one action. Returns the Workload as the API answered (created or
        patched; after a create's 409, the one that holds the name, for the ownership check),
        None after a delete. A Workload that changed since it was read (409) or is gone (404)
        is left alone: its watch event decides again."""
        try:
            if action.kind == "create":
                return self._create(ns, action.body)
            assert workload is not None
            meta = workload["metadata"]
            got: Any = None
            if action.kind == "delete":
                body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=meta["uid"]))
                self.custom.delete_namespaced_custom_object(
                    kueue.GROUP, kueue.VERSION, ns, kueue.WORKLOADS, meta["name"], body=body
                )
            elif action.kind == "set_active":
                patch = {**action.body}
                patch["metadata"] = {
                    **action.body.get("metadata", {}),
                    "resourceVersion": meta["resourceVersion"],
                }
                got = self.custom.patch_namespaced_custom_object(
                    kueue.GROUP, kueue.VERSION, ns, kueue.WORKLOADS, meta["name"], patch
                )
            else:
                got = self._patch_status(ns, meta, action.body)
            metrics.count_api_call(_verb(action), "workload", 200)
            return dict(got) if got is not None else None
        except ApiException as e:
            metrics.count_api_call(_verb(action), "workload", e.status or 0)
            if e.status not in (404, 409):
                raise
            log.info(
                "workload %s/%s: %s answered %s", ns, _name(workload, action), action.kind, e.status
            )
        return None

    def _create(self, ns: str, body: Obj) -> Obj | None:
        try:
            created: Any = self.custom.create_namespaced_custom_object(
                kueue.GROUP, kueue.VERSION, ns, kueue.WORKLOADS, body
            )
            metrics.count_api_call("create", "workload", 201)
            return dict(created)
        except ApiException as e:
            metrics.count_api_call("create", "workload", e.status or 0)
            if e.status != 409:
                raise
        got: Any = self.custom.get_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, ns, kueue.WORKLOADS, body["metadata"]["name"]
        )
        return dict(got)

    def _patch_status(self, ns: str, meta: Obj, status: Obj) -> Any:
        """The whole status, if the Workload is still at the resourceVersion it was decided
        from (as the job's own status is written, controller._patch_status)."""
        patch = [
            {
                "op": "replace",
                "path": "/metadata/resourceVersion",
                "value": meta["resourceVersion"],
            },
            {"op": "add", "path": "/status", "value": status},
        ]
        return self.custom.patch_namespaced_custom_object_status(
            kueue.GROUP,
            kueue.VERSION,
            ns,
            kueue.WORKLOADS,
            meta["name"],
            patch,
            _content_type="application/json-patch+json",
        )


def _verb(action: WorkloadAction) -> str:
    return {"create": "create", "delete": "delete"}.get(action.kind, "patch")


def _name(workload: Obj | None, action: WorkloadAction) -> str:
    if workload is not None:
        return str(workload["metadata"]["name"])
    return str(action.body.get("metadata", {}).get("name"))
