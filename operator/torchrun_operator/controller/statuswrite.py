"""The job's status written whole at the resourceVersion it was decided from (409: re-read and
decided again; 404: the job is gone), and the job's own deletion (TTL).
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchrun_operator import metrics
from torchrun_operator.api.names import GROUP, PLURAL, VERSION
from torchrun_operator.controller.state import ControllerState, Obj, ok_codes
from torchrun_operator.kube import events
from torchrun_operator.kube.client import api_message, invalid_fields

# The controller's one logger (torchrun_operator.controller), whichever part logs.
log = logging.getLogger(__package__)


class JobGone(Exception):
    """The job is gone (404 on its status): forget it."""


class StatusWrites(ControllerState):
    """The job's status and deletion written, exactly at what the plan was made from."""

    def _patch_status(self, job: Obj, status: Obj) -> bool:
        """Writes the whole status if the job is still at the resourceVersion it was decided
        from; True when written. On 409 the job is re-read and decided again; on 404 it is
        forgotten (raises JobGone)."""
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
            if ok_codes(e, 404):
                raise JobGone from e
            if ok_codes(e, 409):
                self._reread(job)
                return False
            if ok_codes(e, 422):
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
            if ok_codes(e, 404):
                raise JobGone from e
            raise
        if fresh["metadata"].get("uid") != meta.get("uid"):
            raise JobGone  # deleted and re-created under the same name: a new job
        self.jobs.put(fresh)
        self.queue.add(key)

    def _delete_job(self, job: Obj) -> None:
        """TTL: delete exactly this job; a job re-created under its name has another uid.
        A 409 raises, so the worker tries again after its back-off: if the name now holds
        another job (the uid precondition failed), that reconcile is of the new job and
        deletes nothing; if the conflict was passing, ours is deleted then. Taken for done,
        it left a finished job past its TTL for ever (nothing else wakes a finished job)."""
        meta = job["metadata"]
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=meta["uid"]))
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], body=body
            )
            metrics.count_api_call("delete", "distributedtrainingjob", 200)
        except ApiException as e:
            metrics.count_api_call("delete", "distributedtrainingjob", e.status or 0)
            if not ok_codes(e, 404):
                raise
