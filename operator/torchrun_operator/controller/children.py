"""The job's children (Service, ConfigMap, NetworkPolicy: reconcile.children says which),
created idempotently and used only when they are this job's (controller uid); an object of
another owner in a name the job needs is kept as a conflict the job's status shows.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from torchrun_operator import metrics
from torchrun_operator.controller.state import ControllerState, Obj, ok_codes
from torchrun_operator.kube.client import get_or_none
from torchrun_operator.reconcile import children
from torchrun_operator.render import kueue


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


class Children(ControllerState):
    """The job's children created, and the objects in their way."""

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
        def read() -> Obj:
            if kind != "Workload":
                got: Obj = self.writes.get(ns, kind, name)
                return got
            resp: Any = self.custom.get_namespaced_custom_object(
                kueue.GROUP, kueue.VERSION, ns, kueue.WORKLOADS, name, _preload_content=False
            )
            decoded: Obj = json.loads(resp.data)
            return decoded

        got = get_or_none(kind, read)
        if got is not None:
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
            if not ok_codes(e, 409):
                raise
        existing = self._read(ns, kind, obj["metadata"]["name"])
        if existing is None:
            raise ApiException(status=409, reason=f"{kind} {obj['metadata']['name']} conflict")
        return existing
