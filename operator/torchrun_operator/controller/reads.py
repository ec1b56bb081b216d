"""Reads from the caches, not the API: the pods' views the reconciler takes (remembered per
cached pod), the launchers' status port the rank map reads, and the jobs the metrics count.
"""

from __future__ import annotations

from pydantic import ValidationError

from torchrun_operator import metrics
from torchrun_operator.controller.state import ControllerState, Obj
from torchrun_operator.launcher.contract import STATUS_PORT
from torchrun_operator.reconcile import observe
from torchrun_operator.render.ports import status_port

# Views of cached pods remembered (kube/cache.py keeps each pod object unchanged until a
# newer one replaces it): a reconcile reads every pod of its job, an event changes one.
# Past this many the memo starts afresh; more than the pods of 16 jobs of 512 nodes.
VIEW_MEMO_SIZE = 8192


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

    def _view(self, pod: Obj, trainer: str | None) -> observe.PodView:
        """observe.view, remembered per cached pod object (the cache never changes one)."""
        got = self._views.get(id(pod))
        if got is not None and got[0] is pod and got[1] == trainer:
            return got[2]
        v = observe.view(pod, trainer)
        if len(self._views) >= VIEW_MEMO_SIZE:
            self._views.clear()
        self._views[id(pod)] = (pod, trainer, v)
        return v
