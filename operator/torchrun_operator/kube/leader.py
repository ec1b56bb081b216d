"""Leader election on a coordination.k8s.io Lease, so two replicas never act on one job.

The holder renews every `renew` seconds; a candidate takes the Lease over only when it has not
been renewed for `duration` seconds. A holder that cannot renew within `duration` steps down
before anyone else can take over (renew < duration), so two leaders never overlap as long as
clocks tick at the same rate.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        duration: float = 15.0,
        renew: float = 5.0,
    ) -> None:
        self._coord = client.CoordinationV1Api(api)
        self._ns, self._name, self._id = namespace, name, identity
        self._on_started, self._on_stopped = on_started, on_stopped
        self._duration, self._renew = duration, renew
        self._stop = threading.Event()
        self._last_renew: dt.datetime | None = None
        self.is_leader = False
        self.thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
        if self.is_leader:
            self._release()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                held = self._try_acquire_or_renew()
            except Exception as e:  # noqa: BLE001 - any failure is "could not renew"
                log.warning("leader election: %s", e)
                held = False
            if held:
                self._last_renew = _now()
                if not self.is_leader:
                    self.is_leader = True
                    log.info("became leader (lease %s/%s)", self._ns, self._name)
                    self._on_started()
            elif self.is_leader and (
                self._last_renew is None
                or (_now() - self._last_renew).total_seconds() > self._duration - self._renew
            ):
                self.is_leader = False
                log.warning("lost leadership (lease %s/%s)", self._ns, self._name)
                self._on_stopped()
            self._stop.wait(self._renew)

    def _try_acquire_or_renew(self) -> bool:
        now = _now()
        try:
            lease = self._coord.read_namespaced_lease(self._name, self._ns)
        except ApiException as e:
            if e.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self._name, namespace=self._ns),
                spec=client.V1LeaseSpec(
                    holder_identity=self._id,
                    lease_duration_seconds=int(self._duration),
                    acquire_time=now,
                    renew_time=now,
                    lease_transitions=0,
                ),
            )
            try:
                self._coord.create_namespaced_lease(self._ns, body)
                return True
            except ApiException as e2:
                if e2.status == 409:
                    return False
                raise
        spec = lease.spec or client.V1LeaseSpec()
        lease.spec = spec
        holder = spec.holder_identity
        renewed = spec.renew_time or spec.acquire_time
        expired = renewed is None or (now - renewed).total_seconds() > (
            spec.lease_duration_seconds or self._duration
        )
        if holder not in (self._id, None, "") and not expired:
            return False
        if holder != self._id:
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.acquire_time = now
        spec.holder_identity = self._id
        spec.renew_time = now
        spec.lease_duration_seconds = int(self._duration)
        # replace carries resourceVersion: a concurrent writer makes this fail with 409.
        try:
            self._coord.replace_namespaced_lease(self._name, self._ns, lease)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    def _release(self) -> None:
        try:
            lease = self._coord.read_namespaced_lease(self._name, self._ns)
            if lease.spec is not None and lease.spec.holder_identity == self._id:
                lease.spec.holder_identity = None
                lease.spec.renew_time = None
                self._coord.replace_namespaced_lease(self._name, self._ns, lease)
        except Exception as e:  # noqa: BLE001 - best effort on shutdown
            log.info("could not release lease: %s", e)
