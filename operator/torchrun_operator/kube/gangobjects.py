"""The gang objects of each attempt (render/gang.py) against the API: thin I/O.

What to do is read from the status the controller has just written (status.scheduling, by
reconcile/gang.py): create the current attempt's Workload and PodGroup (or the PodGroup of
coscheduling or Volcano), then delete the job's gang objects of any other attempt. Deletes
carry the uid precondition and only touch objects whose controller is the job, by uid; the
garbage collector removes the rest with the job.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchrun_operator import metrics
from torchrun_operator.api import names
from torchrun_operator.kube.client import api_message
from torchrun_operator.render.gang import KINDS, Kind, render_gang

log = logging.getLogger(__name__)

Obj = dict[str, Any]

# Creates of one gang object per sync while each is answered 409 and the object is then gone.
CREATE_TRIES = 3


def _controller_uid(obj: Obj) -> str | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


class GangRefused(Exception):
    """The attempt's gang objects could not be made: the job's pods must not start without."""


class GangObjects:
    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        # job uid -> (gang, attempt) whose objects exist and whose predecessors are deleted.
        self._done: dict[str, tuple[str, int]] = {}

    def forget(self, uid: str) -> None:
        self._done.pop(uid, None)

    def sync(self, job: Obj, status: Obj) -> None:
        """Makes the API match status.scheduling; raises GangRefused with the apiserver's
        words when an object cannot be created (the API or CRD is missing, RBAC, a name held
        by an object that is not the job's)."""
        record = status.get("scheduling")
        if not record or status.get("phase") in ("Succeeded", "Failed"):
            return  # a finished job starts no pods: its last gang stays until the job goes
        meta = job["metadata"]
        uid, ns = meta["uid"], meta["namespace"]
        key = (str(record["gang"]), int(record["attempt"]))
        if self._done.get(uid) == key:
            return
        kinds = {k.kind: k for k in KINDS[key[0]]}
        for obj in render_gang(job, key[1]):
            self._create(ns, uid, kinds[obj["kind"]], obj)
        for kind in KINDS[key[0]]:
            try:
                self._delete_others(ns, meta["name"], uid, kind, key[1])
            except ApiException as e:
                what = f"{kind.plural}.{kind.group}"
                raise GangRefused(
                    f"cleaning up {what} of earlier attempts refused ({e.status}): {api_message(e)}"
                ) from e
        self._done[uid] = key

    def _create(self, ns: str, uid: str, kind: Kind, obj: Obj) -> None:
        """Done once the object exists and is the job's. A 409 whose object is then gone
        (404: it was being deleted, e.g. a predecessor's under the same name) made nothing:
        the create is tried again, at most CREATE_TRIES times, then the sync fails and the
        next reconcile tries again; the pods never start without it."""
        name = obj["metadata"]["name"]
        what = f"{kind.kind} {ns}/{name} ({kind.api_version})"
        for _ in range(CREATE_TRIES):
            try:
                self.custom.create_namespaced_custom_object(
                    kind.group, kind.version, ns, kind.plural, obj, _preload_content=False
                )
                metrics.count_api_call("create", kind.kind.lower(), 201)
                return
            except ApiException as e:
                metrics.count_api_call("create", kind.kind.lower(), e.status or 0)
                if e.status != 409:
                    raise GangRefused(
                        f"creating {what} refused ({e.status}): {api_message(e)}"
                    ) from e
            try:
                existing = self._get(ns, kind, name)
            except ApiException as e:
                raise GangRefused(f"reading {what} refused ({e.status}): {api_message(e)}") from e
            if existing is None:
                continue
            if _controller_uid(existing) != uid:
                raise GangRefused(f"{what} exists and is not this job's; delete or rename it")
            return
        raise GangRefused(
            f"creating {what}: the name was taken (409) and then free (404), {CREATE_TRIES} times"
        )

    def _get(self, ns: str, kind: Kind, name: str) -> Obj | None:
        try:
            resp: Any = self.custom.get_namespaced_custom_object(
                kind.group, kind.version, ns, kind.plural, name, _preload_content=False
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        got: Obj = json.loads(resp.data)
        return got

    def _delete_others(self, ns: str, job_name: str, uid: str, kind: Kind, attempt: int) -> None:
        resp: Any = self.custom.list_namespaced_custom_object(
            kind.group,
            kind.version,
            ns,
            kind.plural,
            label_selector=f"{names.LABEL_JOB_NAME}={job_name}",
            _preload_content=False,
        )
        metrics.count_api_call("list", kind.kind.lower(), 200)
        for item in json.loads(resp.data).get("items") or []:
            meta = item.get("metadata") or {}
            labels = meta.get("labels") or {}
            if _controller_uid(item) != uid or meta.get("deletionTimestamp"):
                continue
            if labels.get(names.LABEL_ATTEMPT) == str(attempt):
                continue
            body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=meta["uid"]))
            try:
                self.custom.delete_namespaced_custom_object(
                    kind.group, kind.version, ns, kind.plural, meta["name"], body=body
                )
                metrics.count_api_call("delete", kind.kind.lower(), 200)
                log.info("deleted %s %s/%s of an earlier attempt", kind.kind, ns, meta["name"])
            except ApiException as e:
                metrics.count_api_call("delete", kind.kind.lower(), e.status or 0)
                if e.status not in (404, 409):
                    raise
