"""Fencing: once this replica's term is over, no write of ours is sent (kube/leader.Gate,
checked by kube/client.ApiClient right before each write), and a reconcile in flight stops
at its next write instead of carrying its fan-out on."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fake_transport import FakeTransport, api
from kubernetes import client
from test_leader_election import Clock, Replica, Store  # the election's fakes
from torchrun_operator.controller import STOP_GRACE_SECONDS, Controller
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube import faults
from torchrun_operator.kube.leader import (
    FENCE_MARGIN_SECONDS,
    LEASE_DURATION_SECONDS,
    RENEW_DEADLINE_SECONDS,
    RETRY_PERIOD_SECONDS,
    FencedError,
    Gate,
)
from torchrun_operator.kube.workqueue import WorkQueue

POD = {"kind": "Pod", "metadata": {"name": "p"}}


def test_the_gate_is_open_for_a_term_and_shut_at_its_end_by_the_clock_alone() -> None:
    clock = Clock()
    clock.t = 100.0
    gate = Gate(clock)
    with pytest.raises(FencedError):
        gate.check("POST /x")  # closed until a term opens it
    gate.open(until=110.0)
    gate.check("POST /x")
    assert gate.left() == 10.0
    clock.t = 110.0  # nobody closed it: the term's end alone shuts it
    with pytest.raises(FencedError, match="not the leader"):
        gate.check("POST /x")
    gate.open()
    clock.t = 1e9
    gate.check("POST /x")  # a single replica's gate: open for ever
    gate.close()
    with pytest.raises(FencedError):
        gate.check("POST /x")


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


def test_a_gated_write_is_bounded_as_a_whole_within_the_fence_margin() -> None:
    t = FakeTransport()
    a = api(t)
    a.gate = Gate()
    a.gate.open()
    kclient.Writes(a).create("ns", POD)
    client.CoreV1Api(a).read_namespaced_pod("p", "ns")
    # A single number is urllib3's total: connect and answer together.
    assert [s.timeout for s in t.sent] == [kclient.WRITE_TIMEOUT_SECONDS, kclient.REQUEST_TIMEOUT]
    assert FENCE_MARGIN_SECONDS == LEASE_DURATION_SECONDS - RENEW_DEADLINE_SECONDS
    assert 0 < kclient.WRITE_TIMEOUT_SECONDS < FENCE_MARGIN_SECONDS
    # stop() waits for a write in flight to be given up on before the Lease is released.
    assert kclient.WRITE_TIMEOUT_SECONDS < STOP_GRACE_SECONDS < LEASE_DURATION_SECONDS
    # urllib3 sends nothing again by itself: a second attempt would skip the gate's check.
    assert kclient.RETRIES.connect == 0 and kclient.RETRIES.read == 0


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
        gate.check("POST /pods")
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
