"""Kueue: the job's Workload read from the watch's cache, what its admission puts into the pods,
and the Workload's actions (reconcile/admission.py decides them) carried out.
"""

from __future__ import annotations

import logging

from torchrun_operator.controller.children import Children, controller_uid
from torchrun_operator.controller.state import Obj
from torchrun_operator.reconcile import Plan
from torchrun_operator.reconcile import admission as kueue_admission
from torchrun_operator.reconcile.admission import Admission
from torchrun_operator.render import kueue

# The controller's one logger (torchrun_operator.controller), whichever part logs.
log = logging.getLogger(__package__)

# How soon a job blocked by an object that is not its own looks again: the object may be a
# predecessor's child the garbage collector is about to delete.
BLOCKED_RETRY_SECONDS = 5.0


class KueueSync(Children):
    """The job's Workload: read for the reconciler, written after its status."""

    def _workload(self, job: Obj) -> Obj | None:
        """The job's own Workload (controller uid) from the watch's cache, None if none."""
        meta = job["metadata"]
        ours = [
            w
            for w in self.workloads.pods((meta["namespace"], meta["name"]))
            if controller_uid(w) == meta["uid"]
        ]
        return next((w for w in ours if not w["metadata"].get("deletionTimestamp")), None)

    def _priority(self, job: Obj, workload: Obj | None) -> int | None:
        """The value of the job's WorkloadPriorityClass, read only while it has no Workload
        (the priority is fixed when the Workload is created)."""
        name = kueue.priority_class(job)
        if self.kueue is None or workload is not None or name is None:
            return None
        value = self.kueue.priority(name)
        if value is None:
            # Nothing watches WorkloadPriorityClasses: look again for the one it names.
            meta = job["metadata"]
            self.queue.add((meta["namespace"], meta["name"]), after=BLOCKED_RETRY_SECONDS)
        return value

    def _admission(
        self, job: Obj, workload: Obj | None, priority: int | None
    ) -> tuple[Admission | None, Obj]:
        """What Kueue says (None: not queued through it), and the job to render pods from:
        once admitted, with what admission puts into the pods (the assigned flavors' node
        labels and tolerations), read once per Workload change."""
        if self.kueue is None:
            return None, job
        verdict = kueue_admission.admission(job, workload, priority)
        if verdict is None or not verdict.admitted or workload is None:
            return verdict, job
        uid, rv = job["metadata"]["uid"], workload["metadata"].get("resourceVersion", "")
        cached = self._admitted.get(uid)
        if cached is None or cached[0] != rv:
            flavors = self.kueue.flavors(kueue.assigned_flavors(workload))
            cached = (rv, kueue.pod_set_info(workload, flavors))
            self._admitted[uid] = cached
        return verdict, kueue.with_pod_set_info(job, cached[1])

    def _unread_since(self, job_uid: str, workload: Obj | None, now: float) -> float | None:
        """When this operator first saw the job's Workload held back because Kueue could not
        read its namespace; None while it is not. Kept in memory: an operator that restarts
        waits the retry period again, which only delays a Workload that waits anyway."""
        if workload is None or not kueue_admission.namespace_unread(workload):
            self._unread.pop(job_uid, None)
            return None
        wl_uid = str(workload["metadata"].get("uid"))
        seen = self._unread.get(job_uid)
        if seen is None or seen[0] != wl_uid:
            seen = self._unread[job_uid] = (wl_uid, now)
        return seen[1]

    def _sync_workload(
        self, job: Obj, plan: Plan, workload: Obj | None, priority: int | None
    ) -> None:
        """After the job's status is written: create, replace, (de)activate, release or finish
        its Workload, as decided from that status and the pods that are left."""
        assert self.kueue is not None
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        pods = self.pods.pods(key)
        now = self._clock().timestamp()
        since = self._unread_since(meta["uid"], workload, now)
        actions = kueue_admission.workload_actions(
            job, plan.status, workload, pods, now, priority, since
        )
        if since is not None and not actions:
            # Nothing else wakes the job: Kueue will not touch this Workload again.
            due = kueue_admission.namespace_unread_wait(since, now)
            self.queue.add(key, after=max(due, 0.05))
        for action in actions:
            log.info("job %s/%s: workload %s (%s)", *key, action.kind, action.why or "-")
            got = self.kueue.apply(meta["namespace"], workload, action)
            if got is None:
                continue
            if controller_uid(got) != meta["uid"]:
                self._conflict(job, got)  # a Workload of that name that is not the job's
                self.queue.add(key)
            else:
                # As the API answered: the next reconcile need not wait for the watch.
                self.workloads.put(got)
