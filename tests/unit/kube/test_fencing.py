"""Fencing: once this replica's term is over, no write of ours is sent (kube/leader.Gate,
checked by kube/client.ApiClient right before each write), and a reconcile in flight stops
at its next write instead of carrying its fan-out on."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest
import urllib3
from fake_transport import FakeTransport, api
from kubernetes import client
from test_leader_election import Clock, Replica, Store, run  # the election's fakes
from torchrun_operator.controller import STOP_GRACE_SECONDS, Controller
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube import faults
from torchrun_operator.kube.leader import (
    FENCE_MARGIN_SECONDS,
    LEASE_DURATION_SECONDS,
    RENEW_DEADLINE_SECONDS,
    RETRY_PERIOD_SECONDS,
    WRITE_SAFETY_SECONDS,
    FencedError,
    Gate,
    write_deadline,
)
from torchrun_operator.kube.workqueue import WorkQueue

POD = {"kind": "Pod", "metadata": {"name": "p"}}


def admit(gate: Gate, what: str) -> None:
    """What the client does right before a write leaves: FencedError unless the gate is open."""
    with gate.sending(what, kclient.APISERVER_REQUEST_TIMEOUT_SECONDS):
        pass


def test_the_gate_is_open_for_a_term_and_shut_at_its_end_by_the_clock_alone() -> None:
    clock = Clock()
    clock.t = 100.0
    gate = Gate(clock)
    with pytest.raises(FencedError):
        admit(gate, "POST /x")  # closed until a term opens it
    gate.open(until=110.0)
    admit(gate, "POST /x")
    assert gate.left() == 10.0
    clock.t = 110.0  # nobody closed it: the term's end alone shuts it
    with pytest.raises(FencedError, match="not the leader"):
        admit(gate, "POST /x")
    gate.open()
    clock.t = 1e9
    admit(gate, "POST /x")  # a single replica's gate: open for ever
    gate.close()
    with pytest.raises(FencedError):
        admit(gate, "POST /x")


def test_a_closed_gate_refuses_every_write_before_it_is_sent_and_lets_reads_by() -> None:
    t = FakeTransport()
    gate = Gate()
    a = api(t)
    a.gate = gate
    writes = kclient.Writes(a)
    for write in (
        lambda: writes.create("ns", POD),
        lambda: writes.delete_pod("ns", "p", "u"),
        lambda: writes.patch_status("g", "v1", "ns", "things", "j", []),
        # The generated methods too: gang objects, Workloads, the TTL delete use them.
        lambda: client.CoreV1Api(a).delete_namespaced_pod("p", "ns"),
        lambda: client.CustomObjectsApi(a).create_namespaced_custom_object(
            "g", "v1", "ns", "things", {}
        ),
    ):
        with pytest.raises(FencedError):
            write()
    assert t.sent == []
    client.CoreV1Api(a).read_namespaced_pod("p", "ns")  # reads change nothing: not fenced
    assert [s.method for s in t.sent] == ["GET"]
    gate.open()
    writes.create("ns", POD)
    assert [s.method for s in t.sent] == ["GET", "POST"]


def test_the_gate_is_checked_after_a_slow_start_right_before_the_request_leaves() -> None:
    """A write that was held up (here an injected delay) until after the fence is not sent."""
    t = FakeTransport()
    gate = Gate()
    gate.open(until=time.monotonic() + 0.01)
    slow = {"method": "POST", "action": "pass", "delay": 0.1}
    a = api(t, faults.Injector.from_config({"rules": [slow]}))
    a.gate = gate
    with pytest.raises(FencedError):
        kclient.Writes(a).create("ns", POD)
    assert t.sent == []


def test_the_leases_own_client_passes_no_gate_and_shares_the_fault_injector() -> None:
    injector = faults.Injector.from_config({"rules": []})
    gated = kclient.ApiClient(client.Configuration(host="https://x"), injector=injector)
    gated.gate = Gate()
    lease_client = gated.ungated()
    assert lease_client.gate is None and lease_client.injector is injector


def test_a_single_replicas_write_waits_as_long_as_the_apiserver_would() -> None:
    """No election, a gate open for ever: no standby to make room for, so a write waits up to
    the apiserver's own request timeout (it was cut off after 4 s: an apiserver answering in
    5 s failed every write). Reads keep their (connect, read) pair."""
    t = FakeTransport()
    a = api(t)
    a.gate = Gate()
    a.gate.open()
    kclient.Writes(a).create("ns", POD)
    client.CoreV1Api(a).read_namespaced_pod("p", "ns")
    # A single number is urllib3's total: connect and answer together.
    assert [s.timeout for s in t.sent] == [
        kclient.APISERVER_REQUEST_TIMEOUT_SECONDS,
        kclient.REQUEST_TIMEOUT,
    ]
    # stop() waits a while for reconciles in flight; the Lease waits for the writes (Gate.quiet).
    assert 0 < STOP_GRACE_SECONDS < LEASE_DURATION_SECONDS
    # urllib3 sends nothing again by itself: a second attempt would skip the gate's check.
    assert kclient.RETRIES.connect == 0 and kclient.RETRIES.read == 0


def test_the_write_deadline_shrinks_toward_the_fence_and_ends_before_a_standby_starts() -> None:
    """Each write's deadline is computed as it is sent: the time left in the term plus the
    fence's margin less a safety second, at most the apiserver's own 60 s. So a write sent
    just after a renewal may wait long for a slow apiserver, and every write, even one sent
    at the last moment, is over before a standby could start (a lease duration after the
    renewal the term counts from, which is the fence plus the margin)."""
    clock = Clock()
    gate = Gate(clock)
    term_start = 100.0
    clock.t = term_start
    gate.open(until=term_start + RENEW_DEADLINE_SECONDS)  # as a renewal sent at 100 opens it
    standby_soonest = term_start + LEASE_DURATION_SECONDS
    t = FakeTransport()
    a = api(t)
    a.gate = gate
    sent_at = [term_start + x for x in (0.0, 10.0, 20.0, 30.0, 39.0, 39.999)]
    for at in sent_at:
        clock.t = at
        kclient.Writes(a).create("ns", POD)
    deadlines = [s.timeout for s in t.sent]
    assert deadlines == sorted(deadlines, reverse=True) and len(set(deadlines)) == len(sent_at)
    # Right after the renewal the apiserver's own timeout bounds it (59 s > 60 s is not).
    assert deadlines[0] == min(
        RENEW_DEADLINE_SECONDS + FENCE_MARGIN_SECONDS - WRITE_SAFETY_SECONDS,
        kclient.APISERVER_REQUEST_TIMEOUT_SECONDS,
    )
    assert deadlines[-1] == pytest.approx(FENCE_MARGIN_SECONDS - WRITE_SAFETY_SECONDS, abs=0.01)
    for at, deadline in zip(sent_at, deadlines, strict=True):
        assert at + deadline <= standby_soonest - WRITE_SAFETY_SECONDS + 1e-9
    # At the fence, nothing is sent.
    clock.t = term_start + RENEW_DEADLINE_SECONDS
    with pytest.raises(FencedError):
        kclient.Writes(a).create("ns", POD)
    assert len(t.sent) == len(sent_at)


def test_the_deadline_is_a_pure_function_of_the_time_left_capped() -> None:
    margin = FENCE_MARGIN_SECONDS - WRITE_SAFETY_SECONDS
    assert write_deadline(0.0, 60.0) == margin  # at the fence: the margin less the safety
    assert write_deadline(-5.0, 60.0) == margin  # (a gate judged shut refuses it first)
    assert write_deadline(10.0, 60.0) == 10.0 + margin
    assert write_deadline(math.inf, 60.0) == 60.0  # no election: the apiserver's own limit
    assert 0 < WRITE_SAFETY_SECONDS < FENCE_MARGIN_SECONDS


class NeverAnswers(FakeTransport):
    """An apiserver that takes each write and never answers: the client gives up at its
    timeout (urllib3's total), which this moves the clock on by."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.given_up_at: list[float] = []

    def request(self, method: str, url: str, *a: Any, **kw: Any) -> Any:
        super().request(method, url, *a, **kw)
        self.clock.t += self.sent[-1].timeout
        self.given_up_at.append(self.clock.t)
        raise urllib3.exceptions.ReadTimeoutError(None, url, "Read timed out.")  # type: ignore[arg-type]


def test_a_write_sent_at_the_fence_is_given_up_on_before_the_standby_starts() -> None:
    """The leader's renewals fail from its second term on; right before its fence it sends a
    write the apiserver never answers. The client gives that write up before the standby
    (which saw the last renewal, and waits a lease duration from then) starts leading."""
    clock = Clock()
    store = Store()
    a = Replica("a", store, clock, gate=Gate(clock))
    b = Replica("b", store, clock)
    run(clock, [a, b], until=RETRY_PERIOD_SECONDS)  # a renews once; b sees it
    assert a.leading and b.events == []
    a.api.down = True
    fence = clock.t + a.elector.gate.left()
    run(clock, [a, b], until=fence - 0.5)
    assert a.leading
    clock.t = fence - 0.001
    t = NeverAnswers(clock)
    w = api(t)
    w.gate = a.elector.gate
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        kclient.Writes(w).create("ns", POD)
    (given_up,) = t.given_up_at
    run(clock, [a, b], until=fence + LEASE_DURATION_SECONDS)
    started = b.first("started")
    assert started is not None and not a.leading
    assert given_up <= started - WRITE_SAFETY_SECONDS


class Held(FakeTransport):
    """Holds each write until `answer` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = threading.Event()
        self.answer = threading.Event()

    def request(self, method: str, url: str, *a: Any, **kw: Any) -> Any:
        got = super().request(method, url, *a, **kw)
        self.arrived.set()
        assert self.answer.wait(10)
        return got


def test_the_lease_is_released_on_shutdown_only_once_no_write_of_ours_is_in_flight() -> None:
    """A released Lease lets the standby start at once, not a margin after our fence: so
    shutting down, the elector first waits for the writes the gate let through to be
    answered (or given up on at their deadlines). It used to release at once."""
    store = Store()
    clock = Clock()
    a = Replica("a", store, clock, gate=Gate())  # the gate on the real clock: writes wait
    clock.t = time.monotonic()  # the elector's clock is the gate's (held still from here)
    a.elector.step()
    assert a.leading and store.lease is not None and store.lease.spec is not None
    t = Held()
    w = api(t)
    w.gate = a.elector.gate
    writing = threading.Thread(target=lambda: kclient.Writes(w).create("ns", POD))
    writing.start()
    assert t.arrived.wait(10)
    stopping = threading.Thread(target=a.elector.stop)
    stopping.start()
    stopping.join(0.3)
    assert stopping.is_alive()  # waiting for the write in flight
    assert store.lease.spec.holder_identity == "a"
    t.answer.set()
    writing.join(10)
    stopping.join(10)
    assert not stopping.is_alive()
    assert store.lease.spec.holder_identity is None  # released once the write was answered


def test_the_elector_opens_the_gate_for_its_term_and_it_shuts_at_the_fence() -> None:
    clock = Clock()
    gate = Gate(clock)
    r = Replica("a", Store(), clock, gate=gate)
    assert r.elector.gate is gate
    r.elector.step()
    assert r.leading and gate.left() == RENEW_DEADLINE_SECONDS
    r.api.down = True
    clock.t += RENEW_DEADLINE_SECONDS
    # The fence thread has not run yet (no check_fence): the gate is shut all the same.
    assert r.leading
    with pytest.raises(FencedError):
        admit(gate, "POST /pods")
    r.elector.check_fence()
    assert not r.leading


def test_a_leader_that_sees_another_holder_shuts_the_gate_at_once() -> None:
    clock = Clock()
    store = Store()
    a = Replica("a", store, clock, gate=Gate(clock))
    a.elector.step()
    assert a.elector.gate.left() > 0
    assert store.lease is not None and store.lease.spec is not None
    store.lease.spec.holder_identity = "b"  # someone else holds it now (a forced takeover)
    a.elector.step()
    assert not a.leading and a.elector.gate.left() == 0


class Sleepy(FakeTransport):
    """Answers each write after `pause` seconds; closes `gate` when the `fence_at`th write
    arrives (the moment the term ends)."""

    def __init__(self, gate: Gate, fence_at: int, pause: float = 0.002) -> None:
        super().__init__()
        self.gate, self.fence_at, self.pause = gate, fence_at, pause
        self.lock = threading.Lock()

    def request(self, method: str, url: str, *a: Any, **kw: Any) -> Any:
        with self.lock:
            answer = super().request(method, url, *a, **kw)
            if len(self.sent) == self.fence_at:
                self.gate.close()
        time.sleep(self.pause)
        return answer


def test_a_fan_out_stops_at_the_fence_and_the_rest_is_never_sent() -> None:
    gate = Gate()
    gate.open()
    t = Sleepy(gate, fence_at=5)
    a = api(t)
    a.gate = gate
    ctrl = Controller(None, workers=0, create_parallelism=4, gate=gate)  # type: ignore[arg-type]
    ctrl.writes = kclient.Writes(a)
    pods = [{"kind": "Pod", "metadata": {"name": f"p-{i}"}} for i in range(64)]
    with pytest.raises(FencedError):
        ctrl._fan_out(lambda p: ctrl._create("ns", p), pods)
    # The rest were refused, unsent; at most the 3 other threads had passed their check
    # (before the fence) while the 5th request was on its way.
    assert 5 <= len(t.sent) <= 8
    ctrl._pool.shutdown(wait=True)


def test_a_fenced_reconcile_is_no_failure_of_the_job_and_a_standby_drops_it() -> None:
    clock = Clock()
    ctrl = Controller(None, workers=0)  # type: ignore[arg-type]
    ctrl.queue = WorkQueue(clock=clock, jitter=lambda: 0.0)
    ctrl.active.set()

    def fenced(key: Any) -> None:
        raise FencedError("POST /pods not sent: this replica is not the leader")

    ctrl.sync = fenced  # type: ignore[method-assign]
    ctrl.queue.add(("ns", "j"))
    key = ctrl.queue.get(timeout=0)
    ctrl.process(key)
    assert ctrl.queue.failures(("ns", "j")) == 0  # no back-off counted
    ctrl.active.clear()  # the fence thread's on_stopped
    clock.t += RETRY_PERIOD_SECONDS
    key = ctrl.queue.get(timeout=0)
    assert key == ("ns", "j")
    ctrl.process(key)  # a standby drops it
    clock.t += 3600
    assert ctrl.queue.get(timeout=0) is None
