"""Reads from the caches, not the API: the pods' views the reconciler takes (remembered per
cached pod), the launchers' status port the rank map reads, and the jobs the metrics count.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError

from torchrun_operator import metrics
from torchrun_operator.controller.state import ControllerState, Obj
from torchrun_operator.kube.cache import JobKey
from torchrun_operator.launcher.contract import STATUS_PORT
from torchrun_operator.reconcile import observe
from torchrun_operator.render.ports import status_port

# A pod's view is remembered by its uid, resourceVersion and trainer name (a pod object at one
# resourceVersion never changes): a reconcile reads every pod of its job, an event changes one.
ViewKey = tuple[str, str, str | None]


class CacheReads(ControllerState):
    """What the reconciler, the rank map and the metrics read from the caches."""

    def _running_jobs(self) -> list[Obj]:
        """The jobs the progress metrics are taken from at scrape time (the leader's only)."""
        if not self.active.is_set():
            return []
        return [j for k in self.jobs.keys() if (j := self.jobs.get(k)) is not None]  # noqa: SIM118

    def _phases_loop(self) -> None:
        while not self._stopped.wait(1.0):
            if self._phases_dirty.is_set():
                self._phases_dirty.clear()
                self._count_phases()

    def _count_phases(self) -> None:
        """The jobs-by-phase gauge from the job cache; a standby replica reports none."""
        with self._phases_lock:
            if not self.active.is_set():
                metrics.set_jobs_by_phase({})
                return
            jobs = (self.jobs.get(k) for k in self.jobs.keys())  # noqa: SIM118
            metrics.set_jobs_by_phase(
                metrics.phase_counts((j or {}).get("status") for j in jobs if j is not None)
            )

    @staticmethod
    def _status_port(job: Obj) -> int:
        """The port the job's launchers answer on (render/ports.py); the contract's for a
        spec the model refuses (its pods, if any, were rendered so)."""
        try:
            return status_port(job)
        except ValidationError:
            return STATUS_PORT

    def _viewer(self, key: JobKey) -> Callable[[Obj, str | None], observe.PodView]:
        """observe.view for one reconcile of a job, remembering the views of the job's last
        reconcile. Only the views this reconcile took are kept for the next one: a memo that
        held every version of every pod kept thousands of old pods alive."""
        before = self._views.get(key, {})
        now: dict[ViewKey, observe.PodView] = {}
        self._views[key] = now

        def view_of(pod: Obj, trainer: str | None) -> observe.PodView:
            meta = pod.get("metadata") or {}
            uid, rv = meta.get("uid"), meta.get("resourceVersion")
            if not uid or not rv:  # not an API object: nothing to remember it by
                return observe.view(pod, trainer)
            at: ViewKey = (uid, rv, trainer)
            v = now.get(at) or before.get(at) or observe.view(pod, trainer)
            now[at] = v
            return v

        return view_of
