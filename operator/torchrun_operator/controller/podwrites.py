"""The pods' creates and deletes, fanned out on the controller's pool; a create the apiserver
refused (Pod Security, a quota, a webhook) is shown on the job and retried with back-off, as is
a refused gang object (kube/gangobjects.py).
"""

from __future__ import annotations

import logging
import time

from kubernetes.client.exceptions import ApiException

from torchrun_operator import metrics
from torchrun_operator.controller.children import Children
from torchrun_operator.controller.state import Obj, ok_codes
from torchrun_operator.kube.client import api_message
from torchrun_operator.kube.gangobjects import GangRefused
from torchrun_operator.kube.workqueue import backoff_delay

# The controller's one logger (torchrun_operator.controller), whichever part logs.
log = logging.getLogger(__package__)

# A pod create the apiserver refused (Pod Security, a quota, a webhook) is retried after
# 2, 4, 8 ... seconds, at most this long: the cause is usually fixed by a person.
REFUSED_RETRY_MAX_SECONDS = 300.0
# Answers to a pod create that a retry alone will not cure, shown on the job.
REFUSED_CODES = (400, 403, 422)
# Where a refused gang object is kept among the refused creates (no pod has this name).
GANG_KEY = "(gang)"


class PodWrites(Children):
    """The plan's pod deletes and creates, and the creates the apiserver refused."""

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

    def _delete_pod(self, ns: str, name: str, uid: str | None, force: bool = False) -> None:
        """Deletes exactly the pod the plan was made from: the uid precondition makes a pod
        that someone re-created under the name since (409) safe. `force`: grace period 0."""
        try:
            body = self.writes.delete_pod(ns, name, uid, force)
            metrics.count_api_call("delete", "pod", 200)
            if body.get("kind") == "Pod":
                # Now carries deletionTimestamp; unless the watch already saw it deleted.
                self.pods.put_if_cached(body)
        except ApiException as e:
            metrics.count_api_call("delete", "pod", e.status or 0)
            if not ok_codes(e, 404, 409):
                raise
