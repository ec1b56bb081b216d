"""Leader election on a coordination.k8s.io Lease, so two replicas never act on one job.

As client-go does it. Expiry is judged by the candidate's own monotonic clock: the Lease has
expired when this candidate has seen no change to it (holder, renewTime, resourceVersion) for
leaseDurationSeconds. The holder's renewTime is only written for people to read; comparing it
with the local wall clock would let a holder whose clock runs an hour ahead keep the Lease
forever, or one 30 s behind lose it while renewing.

Fencing: the leader counts its term from the moment it *sent* its last successful renewal.
A standby can only have seen that renewal after it was written, so it waits at least
`duration` from then; the leader stops acting (on_stopped) `renew_deadline` after it, which is
earlier, whatever state its requests are in: a fence thread enforces it even while a request
hangs. The margin (duration - renew_deadline) covers the difference in clock rates and the
time on_stopped takes to take effect.

Each write of ours is checked against the term right before it is sent (Gate) and given a
deadline from when a standby could start (write_deadline): the end of the term plus the
margin, less a safety second. A write sent just after a renewal may wait for its answer about
as long as the apiserver itself would (a control plane that answers in 10 s is slow, not
down); one sent just before the fence still gets only the margin less that second, so none
of ours is in flight when a standby may start.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

# client-go's defaults (15, 10 and 2 s) times four, their ratio of duration to renew deadline
# kept (it is the difference in clock rates tolerated). A leader keeps its term while each
# renewal lands before the term of the one before it ends: two renewals in a row (a read and
# a write each) and a retry period fit in the renew deadline. With client-go's figures that
# is under 4 s a renewal (and each request is bounded at (10 - 2) / 2 = 4 s), so a control
# plane that answers writes in 5-15 s (seen under load, #54) leaves no replica leading and
# nothing is reconciled at all. Here each request may take 18 s, and renewals of under 18 s
# keep the term. The cost is the failover after a leader dies without releasing the Lease (a
# SIGKILL, a lost node): the standby waits a whole lease duration, 60 s instead of 15. A
# leader that shuts down releases the Lease, and the standby starts at once.
LEASE_DURATION_SECONDS = 60.0
RENEW_DEADLINE_SECONDS = 40.0
RETRY_PERIOD_SECONDS = 4.0
# How long after our fence a standby may take over at the soonest (it waits a whole lease
# duration from the renewal our term is counted from). A write sent right before the fence
# must be over by then (write_deadline).
FENCE_MARGIN_SECONDS = LEASE_DURATION_SECONDS - RENEW_DEADLINE_SECONDS
# A write's deadline ends this long before a standby may start at the soonest: the time its
# timeout takes to take effect (urllib3 checks it between reads of the socket; the thread
# must then come back from the call) and the difference in two replicas' clock rates over a
# margin. A second is ample for both.
WRITE_SAFETY_SECONDS = 1.0


def write_deadline(left: float, cap: float) -> float:
    """The seconds a write sent `left` seconds before the fence may take in all (connect and
    answer): until a standby could start at the soonest (FENCE_MARGIN_SECONDS after the
    fence) less WRITE_SAFETY_SECONDS, at most `cap` (the apiserver's own limit on a request:
    waiting longer is waiting for no answer). It shrinks as the fence nears, to the margin
    less the safety at the fence; a gate open for ever (no election) gives `cap`."""
    return min(max(left, 0.0) + FENCE_MARGIN_SECONDS - WRITE_SAFETY_SECONDS, cap)


class FencedError(Exception):
    """A write refused before it was sent: this replica does not lead, or its term ran out.
    Not a failure of the job: the reconcile stops, and the leader (whoever it is) does it."""


class Gate:
    """Whether this replica may write now: open until the end of its term. Checked right
    before each write is sent, from any thread; judged by the clock at that moment, so a
    fence thread that runs late (or a callback in progress) lets nothing through. It knows
    the writes it let through that are still in flight, so that the Lease is released only
    once none of ours can land after a standby starts (quiet)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until = -math.inf  # closed until someone opens it
        self._cond = threading.Condition()
        self._ids = itertools.count()
        self._in_flight: dict[int, float] = {}  # write -> when it is given up on (our clock)

    def open(self, until: float = math.inf) -> None:
        """Open until `until` on the gate's clock (a term); for ever without one (a single
        replica that elects no leader)."""
        self._until = until

    def close(self) -> None:
        self._until = -math.inf

    def left(self) -> float:
        """Seconds until the gate closes; 0 when it is closed."""
        return max(self._until - self._clock(), 0.0)

    @contextlib.contextmanager
    def sending(self, what: str, cap: float) -> Iterator[float]:
        """Around one write, right before it is sent: FencedError unless the gate is open,
        else the write's deadline in seconds (write_deadline), both from one reading of
        the clock; the write counts as in flight until the block ends or its deadline
        passes."""
        with self._cond:
            now = self._clock()
            left = self._until - now
            if left <= 0:
                raise FencedError(f"{what} not sent: this replica is not the leader")
            deadline = write_deadline(left, cap)
            write = next(self._ids)
            self._in_flight[write] = now + deadline
        try:
            yield deadline
        finally:
            with self._cond:
                del self._in_flight[write]
                self._cond.notify_all()

    def quiet(self, timeout: float) -> bool:
        """Waits, `timeout` seconds at most, until no write this gate let through can still
        be in flight: each was answered or its deadline passed. True once so."""
        with self._cond:
            end = self._clock() + timeout
            while True:
                now = self._clock()
                last = max(self._in_flight.values(), default=-math.inf)
                if last <= now:
                    return True
                if now >= end:
                    return False
                self._cond.wait(min(last, end) - now)


class LeaseApi(Protocol):
    """The part of CoordinationV1Api the elector uses (a fake in tests)."""

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> Any: ...

    def create_namespaced_lease(self, namespace: str, body: Any, **kw: Any) -> Any: ...

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any, **kw: Any) -> Any: ...


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _record(lease: Any) -> tuple[Any, ...]:
    """What makes one version of the Lease differ from another, to the eye of a candidate."""
    spec = lease.spec or client.V1LeaseSpec()
    meta = lease.metadata or client.V1ObjectMeta()
    return (
        meta.resource_version,
        spec.holder_identity,
        spec.renew_time,
        spec.acquire_time,
        spec.lease_transitions,
        spec.lease_duration_seconds,
    )


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient | None,
        namespace: str,
        name: str,
        identity: str,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        duration: float = LEASE_DURATION_SECONDS,
        renew_deadline: float = RENEW_DEADLINE_SECONDS,
        retry: float = RETRY_PERIOD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = _now,
        leases: LeaseApi | None = None,
        gate: Gate | None = None,
    ) -> None:
        if not 0 < retry < renew_deadline < duration:
            raise ValueError("leader election needs 0 < retry < renew_deadline < duration")
        # cast: the generated client's signatures are stricter than the protocol spells out.
        self._leases = (
            leases if leases is not None else cast(LeaseApi, client.CoordinationV1Api(api))
        )
        self._ns, self._name, self._id = namespace, name, identity
        self._on_started, self._on_stopped = on_started, on_stopped
        self._duration, self._renew_deadline, self._retry = duration, renew_deadline, retry
        # One attempt is a read and a write; both fit in the renew deadline less a retry
        # period, so a leader whose requests time out still gets another attempt in its term.
        # (The fence does not rely on it: urllib3 may retry a request that timed out.)
        self._request_timeout = (renew_deadline - retry) / 2
        self._clock, self._wall = clock, wall
        # Opened for each term, closed when it ends (its clock must be ours: terms are ours).
        self.gate = gate if gate is not None else Gate(clock)
        self._stop = threading.Event()
        # Guards the state below, and runs on_started/on_stopped in the order of the
        # transitions they report (the loop and the fence thread both make them).
        self._lock = threading.Condition()
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0  # our clock when the Lease last changed
        self._leading_until: float | None = None  # end of our term unless we renew
        self.is_leader = False
        self.thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._fence_thread = threading.Thread(target=self._fence, name="leader-fence", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self._fence_thread.start()

    def dead_threads(self) -> list[str]:
        """The election's threads that died (a callback that raised); for the liveness probe."""
        if self._stop.is_set():
            return []
        threads = (self.thread, self._fence_thread)
        return [t.name for t in threads if t.ident is not None and not t.is_alive()]

    def stop(self) -> None:
        """Stops campaigning, stops leading, and releases the Lease if we hold it, so a
        standby takes over at once. Stop what acts on leadership (the controller) first."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        for thread, limit in ((self.thread, self._renew_deadline), (self._fence_thread, 1.0)):
            if thread.is_alive():
                thread.join(timeout=limit)
        with self._lock:
            if self.is_leader:
                self._stop_leading("shutting down", level=logging.INFO)
        # A released Lease lets a standby start at once, not a margin after our fence: only
        # once no write of ours can still land (each is answered or given up on by its
        # deadline, which is less than a lease duration away). Else the Lease expires.
        if not self.gate.quiet(self._duration):
            log.warning("lease %s/%s not released: writes of ours in flight", self._ns, self._name)
            return
        self._release()

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self._retry)

    def step(self) -> None:
        """One attempt to acquire or renew the Lease (the loop's body; tests call it)."""
        started = self._clock()
        try:
            held = self._try_acquire_or_renew()
        except Exception as e:  # noqa: BLE001 - any failure is "could not renew"
            log.warning("leader election: %s", _describe(e))
            held = False
        with self._lock:
            if held and not self._stop.is_set():
                self._renewed(started)
            self.check_fence()

    def _renewed(self, started: float) -> None:
        """A write sent at `started` succeeded: we lead until started + renew_deadline."""
        until = started + self._renew_deadline
        if self._clock() >= until:
            # It took longer than a term: the fence may have fired; leading on it now would
            # be leading past the deadline. The next attempt starts a fresh term.
            log.warning("leader election: renewal took %.1f s", self._clock() - started)
            return
        self._leading_until = until
        self.gate.open(until)
        self._lock.notify_all()
        if not self.is_leader:
            self.is_leader = True
            log.info("became leader (lease %s/%s)", self._ns, self._name)
            self._on_started()

    def check_fence(self) -> None:
        """Stops leading once the term is over (the fence thread calls it on time)."""
        with self._lock:
            if (
                self.is_leader
                and self._leading_until is not None
                and self._clock() >= self._leading_until
            ):
                self._stop_leading(f"could not renew within {self._renew_deadline:g} s")

    def _stop_leading(self, why: str, level: int = logging.WARNING) -> None:
        # Called with the lock held.
        self.gate.close()  # first: whatever on_stopped does, no write leaves from here on
        if not self.is_leader:
            return
        self.is_leader = False
        self._leading_until = None
        log.log(level, "lost leadership (lease %s/%s): %s", self._ns, self._name, why)
        self._on_stopped()

    def _fence(self) -> None:
        with self._lock:
            while not self._stop.is_set():
                self.check_fence()
                left = None
                if self.is_leader and self._leading_until is not None:
                    left = max(self._leading_until - self._clock(), 0.0)
                self._lock.wait(left)

    # -- the API -----------------------------------------------------------------------------

    def _observe(self, lease: Any) -> None:
        record = _record(lease)
        with self._lock:
            if record != self._observed:
                self._observed = record
                # After the response: the change happened no later than now.
                self._observed_at = self._clock()

    def _expired(self, spec: Any) -> bool:
        duration = spec.lease_duration_seconds or self._duration
        with self._lock:
            return self._clock() - self._observed_at > duration

    def _try_acquire_or_renew(self) -> bool:
        timeout = self._request_timeout
        now = self._wall()
        try:
            lease = self._leases.read_namespaced_lease(
                self._name, self._ns, _request_timeout=timeout
            )
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
                created = self._leases.create_namespaced_lease(
                    self._ns, body, _request_timeout=timeout
                )
            except ApiException as e2:
                if e2.status == 409:
                    return False
                raise
            self._observe(created)
            return True
        self._observe(lease)
        spec = lease.spec or client.V1LeaseSpec()
        lease.spec = spec
        holder = spec.holder_identity
        if holder not in (self._id, None, ""):
            with self._lock:
                self._stop_leading(f"the lease is held by {holder}")
            if not self._expired(spec):
                return False
        if holder != self._id:
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.acquire_time = now
        spec.holder_identity = self._id
        spec.renew_time = now
        spec.lease_duration_seconds = int(self._duration)
        # replace carries resourceVersion: a concurrent writer makes this fail with 409.
        try:
            written = self._leases.replace_namespaced_lease(
                self._name, self._ns, lease, _request_timeout=timeout
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        self._observe(written)
        return True

    def _release(self) -> None:
        try:
            lease = self._leases.read_namespaced_lease(
                self._name, self._ns, _request_timeout=self._request_timeout
            )
            if lease.spec is not None and lease.spec.holder_identity == self._id:
                lease.spec.holder_identity = None
                lease.spec.renew_time = None
                self._leases.replace_namespaced_lease(
                    self._name, self._ns, lease, _request_timeout=self._request_timeout
                )
                log.info("released lease %s/%s", self._ns, self._name)
        except Exception as e:  # noqa: BLE001 - best effort on shutdown
            log.info("could not release lease: %s", _describe(e))


def _describe(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"API error {e.status} {e.reason}"
    return f"{type(e).__name__}: {e}"
