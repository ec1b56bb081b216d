"""Leader election with a fake Lease API and a fake clock: expiry by observation, fencing."""

from __future__ import annotations

import copy
import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from torchrun_operator.kube.leader import (
    LEASE_DURATION_SECONDS,
    RENEW_DEADLINE_SECONDS,
    RETRY_PERIOD_SECONDS,
    LeaderElector,
)

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class Clock:
    """Every replica's monotonic clock: they tick at one rate (their offsets do not matter)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Store:
    """The apiserver's one Lease, with resourceVersion checks on replace."""

    lease: client.V1Lease | None = None
    rv: int = 0

    def write(self, body: client.V1Lease) -> client.V1Lease:
        self.rv += 1
        body = copy.deepcopy(body)
        assert body.metadata is not None
        body.metadata.resource_version = str(self.rv)
        self.lease = body
        return copy.deepcopy(body)


@dataclass
class Leases:
    """One replica's view of the API: `down` makes its requests fail, `before_write` runs
    before each of its writes lands (a slow request). With a `clock`, each read and each
    write takes `read_seconds` and `write_seconds` of it to be answered, or is given up on
    at its timeout (a slow apiserver)."""

    store: Store
    down: bool = False
    before_write: Callable[[], object] | None = None
    timeouts: list[Any] = field(default_factory=list)
    clock: Clock | None = None
    read_seconds: float = 0.0
    write_seconds: float = 0.0

    def _call(self, kw: dict[str, Any], seconds: float = 0.0) -> None:
        timeout = kw.get("_request_timeout")
        self.timeouts.append(timeout)
        if self.down:
            raise ApiException(status=503, reason="unreachable")
        if self.clock is not None and seconds > 0:
            if timeout is not None and seconds > timeout:
                self.clock.t += timeout
                raise urllib3.exceptions.ReadTimeoutError(None, "/leases", "timed out")  # type: ignore[arg-type]
            self.clock.t += seconds

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> Any:
        self._call(kw, self.read_seconds)
        if self.store.lease is None:
            raise ApiException(status=404, reason="NotFound")
        return copy.deepcopy(self.store.lease)

    def create_namespaced_lease(self, namespace: str, body: Any, **kw: Any) -> Any:
        self._call(kw, self.write_seconds)
        if self.store.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        if self.before_write:
            self.before_write()
        return self.store.write(body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        self._call(kw, self.write_seconds)
        assert self.store.lease is not None and self.store.lease.metadata is not None
        if body.metadata.resource_version != self.store.lease.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        if self.before_write:
            self.before_write()
        return self.store.write(body)


class Replica:
    def __init__(
        self, name: str, store: Store, clock: Clock, wall_skew: float = 0.0, **kw: Any
    ) -> None:
        self.name = name
        self.api = Leases(store)
        self.events: list[tuple[float, str]] = []
        self.elector = LeaderElector(
            None,
            "ns",
            "lease",
            name,
            on_started=lambda: self.events.append((clock.t, "started")),
            on_stopped=lambda: self.events.append((clock.t, "stopped")),
            clock=clock,
            wall=lambda: EPOCH + dt.timedelta(seconds=clock.t + wall_skew),
            leases=self.api,
            **kw,
        )

    @property
    def leading(self) -> bool:
        return self.elector.is_leader

    def first(self, what: str) -> float | None:
        return next((t for t, e in self.events if e == what), None)


def run(
    clock: Clock,
    replicas: list[Replica],
    until: float,
    alive: Callable[[Replica, float], bool] = lambda r, t: True,
    tick: float = 0.5,
) -> None:
    """Each live replica steps every retry period (offset by its index) and its fence is
    checked every tick; never two live leaders at once (a dead one acts no more)."""
    next_step = {r.name: i * tick for i, r in enumerate(replicas)}
    while clock.t <= until:
        for r in replicas:
            if not alive(r, clock.t):
                continue
            r.elector.check_fence()
            if clock.t >= next_step[r.name]:
                r.elector.step()
                next_step[r.name] = clock.t + RETRY_PERIOD_SECONDS
        live = [r for r in replicas if alive(r, clock.t)]
        assert sum(r.leading for r in live) <= 1, f"two leaders at t={clock.t}"
        clock.t += tick


def takeover_time(skew: float) -> float | None:
    """The holder (clock `skew` s off) renews until t=20 then dies; when does b lead?"""
    clock, store = Clock(), Store()
    a = Replica("a", store, clock, wall_skew=skew)
    b = Replica("b", store, clock)
    run(clock, [a, b], until=20 + LEASE_DURATION_SECONDS + 10, alive=lambda r, t: r is b or t < 20)
    assert a.first("started") == 0.0
    return b.first("started")


def test_a_standby_takes_over_a_lease_duration_after_it_last_saw_a_change() -> None:
    t = takeover_time(0.0)
    assert t is not None
    # a's last renewal was the last step before t=20 (it steps every retry period from 0); b
    # saw it half a second later.
    seen = (20 - 1e-9) // RETRY_PERIOD_SECONDS * RETRY_PERIOD_SECONDS + 0.5
    assert (
        seen + LEASE_DURATION_SECONDS
        < t
        <= seen + LEASE_DURATION_SECONDS + RETRY_PERIOD_SECONDS + 0.5
    )


@pytest.mark.parametrize("skew", [3600.0, -30.0])
def test_the_holders_clock_skew_does_not_change_when_the_standby_takes_over(
    skew: float,
) -> None:
    # Judged by renewTime: an hour ahead, the lease would never expire; 30 s behind, the
    # standby would take it from a live leader at once.
    assert takeover_time(skew) == takeover_time(0.0)


def test_a_standby_never_takes_a_lease_that_is_being_renewed() -> None:
    clock, store = Clock(), Store()
    a = Replica("a", store, clock, wall_skew=-30.0)
    b = Replica("b", store, clock, wall_skew=+3600.0)
    run(clock, [a, b], until=120)
    assert a.leading and a.events == [(0.0, "started")]
    assert b.events == []


def test_a_leader_cut_off_from_the_api_stops_before_the_standby_starts() -> None:
    clock, store = Clock(), Store()
    a = Replica("a", store, clock)
    b = Replica("b", store, clock)
    run(clock, [a, b], until=10)
    assert a.leading
    a.api.down = True  # a partition: a can reach nothing, b still can
    run(clock, [a, b], until=10 + LEASE_DURATION_SECONDS + 10)
    stopped, started = a.first("stopped"), b.first("started")
    assert stopped is not None and started is not None
    # a's last good renewal was sent by t=10: it stops by the renew deadline after it...
    assert stopped <= 10 + RENEW_DEADLINE_SECONDS + 0.5
    # ...and b, which saw that renewal no earlier, waits the whole lease duration.
    assert started - stopped >= LEASE_DURATION_SECONDS - RENEW_DEADLINE_SECONDS


def test_a_renewal_that_lands_after_the_deadline_does_not_extend_the_term() -> None:
    clock, store = Clock(), Store()
    a = Replica("a", store, clock)
    a.elector.step()
    assert a.leading

    def hang() -> None:
        clock.t += RENEW_DEADLINE_SECONDS + 1  # the write hangs past the term, then lands

    a.api.before_write = hang
    clock.t += RETRY_PERIOD_SECONDS
    a.elector.step()
    assert not a.leading and a.events == [(0.0, "started"), (clock.t, "stopped")]
    a.api.before_write = None
    clock.t += RETRY_PERIOD_SECONDS
    a.elector.step()  # a prompt renewal starts a new term: it still holds the lease
    assert a.leading and a.events[-1] == (clock.t, "started")


def test_a_leader_that_sees_another_holder_stops_at_once() -> None:
    clock, store = Clock(), Store()
    a = Replica("a", store, clock)
    a.elector.step()
    assert store.lease is not None
    taken = copy.deepcopy(store.lease)
    assert taken.spec is not None
    taken.spec.holder_identity = "someone-else"
    store.write(taken)
    clock.t += 1
    a.elector.step()
    assert not a.leading and a.events[-1] == (1.0, "stopped")


def test_a_leader_keeps_its_term_while_the_apiserver_answers_writes_in_15_s() -> None:
    """A control plane that answers writes in 5-15 s is slow, not down: its Lease renewals
    still land in time, so one replica leads all along and the standby waits. With
    client-go's timings (15/10/2 s: each request given up on after 4 s) no renewal landed
    and the leader lost its Lease 10 s after it won it."""
    clock, store = Clock(), Store()
    a = Replica("a", store, clock)
    b = Replica("b", store, clock)
    a.api.clock, a.api.read_seconds, a.api.write_seconds = clock, 2.0, 15.0
    run(clock, [a, b], until=600)
    assert a.leading and [e for _, e in a.events] == ["started"]  # never stopped
    assert b.events == []


def test_requests_are_bounded_below_the_renew_deadline() -> None:
    clock, store = Clock(), Store()
    a = Replica("a", store, clock)
    for _ in range(3):
        a.elector.step()
        clock.t += RETRY_PERIOD_SECONDS
    assert a.api.timeouts and all(
        t is not None and 2 * t < RENEW_DEADLINE_SECONDS for t in a.api.timeouts
    )


def test_timings_must_leave_the_leader_time_to_stop() -> None:
    with pytest.raises(ValueError):
        LeaderElector(
            None, "ns", "l", "a", lambda: None, lambda: None, duration=10, renew_deadline=10
        )


def test_stop_stops_leading_then_releases_the_lease() -> None:
    clock, store = Clock(), Store()
    a = Replica("a", store, clock)
    b = Replica("b", store, clock)
    a.elector.step()
    b.elector.step()
    a.elector.stop()  # its threads never started: join returns at once
    assert a.events == [(0.0, "started"), (0.0, "stopped")]
    assert store.lease is not None and store.lease.spec is not None
    assert store.lease.spec.holder_identity is None
    b.elector.step()  # a released lease is free at once
    assert b.leading


def test_the_fence_thread_stops_a_leader_whose_request_hangs() -> None:
    store = Store()
    api = Leases(store)
    stopped = threading.Event()
    release = threading.Event()
    e = LeaderElector(
        None,
        "ns",
        "lease",
        "a",
        on_started=lambda: None,
        on_stopped=stopped.set,
        duration=1.5,
        renew_deadline=0.6,
        retry=0.1,
        leases=api,
    )
    e.step()
    assert e.is_leader
    won = time.monotonic()
    api.before_write = lambda: release.wait(5)  # every renewal hangs, as a dead socket does
    e.start()
    try:
        assert stopped.wait(3), "the leader kept leading while its renewal hung"
        assert time.monotonic() - won < 1.5  # before a standby could have taken over
        assert not e.is_leader
    finally:
        release.set()
        e.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_election_thread_shows_for_the_liveness_probe() -> None:
    def boom() -> None:
        raise RuntimeError("on_started failed")

    e = LeaderElector(None, "ns", "l", "a", boom, lambda: None, leases=Leases(Store()))
    assert e.dead_threads() == []  # not started yet: nothing died
    e.start()
    e.thread.join(timeout=5)
    assert e.dead_threads() == ["leader-election"]
    e.stop()
    assert e.dead_threads() == []  # stopped on purpose
