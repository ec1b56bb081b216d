"""The client-side token bucket (kube/ratelimit.py) and its place in the client: a burst goes
at once, then requests leave at the rate, in order; the wait is measured; 0 means no limit."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client as k8s
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube.ratelimit import DEFAULT_BURST, DEFAULT_QPS, TokenBucket


class Clock:
    """Time that moves only when someone sleeps."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_a_burst_goes_at_once_then_one_request_per_interval() -> None:
    clock = Clock()
    bucket = TokenBucket(10.0, 3, clock=clock, sleep=clock.sleep)
    waits = [bucket.wait() for _ in range(6)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    # Each later request reserves the next token: 0.1 s apart, in the order they came.
    assert waits[3:] == pytest.approx([0.1, 0.2, 0.3])
    assert clock.slept == pytest.approx([0.1, 0.2, 0.3])


def test_idle_time_refills_up_to_the_burst_and_no_further() -> None:
    clock = Clock()
    bucket = TokenBucket(10.0, 3, clock=clock, sleep=clock.sleep)
    for _ in range(3):
        bucket.wait()
    clock.t += 100.0  # a long quiet spell banks 3 tokens, not 1000
    assert [bucket.wait() for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.1])


def test_qps_zero_is_no_limit_and_bad_settings_are_refused() -> None:
    clock = Clock()
    bucket = TokenBucket(0.0, 1, clock=clock, sleep=clock.sleep)
    assert [bucket.wait() for _ in range(1000)] == [0.0] * 1000
    with pytest.raises(ValueError, match="qps"):
        TokenBucket(-1.0, 10)
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(10.0, 0)


def test_every_wait_is_observed() -> None:
    clock = Clock()
    seen: list[float] = []
    bucket = TokenBucket(2.0, 1, clock=clock, sleep=clock.sleep, observe=seen.append)
    bucket.wait()
    bucket.wait()
    assert seen == pytest.approx([0.0, 0.5])


def test_threads_share_one_rate() -> None:
    """Many workers at once get the burst and then the rate between them, never more."""
    clock = Clock()
    bucket = TokenBucket(100.0, 10, clock=clock, sleep=clock.sleep)
    waits: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(10):
            w = bucket.reserve()
            with lock:
                waits.append(w)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(waits) == pytest.approx([0.0] * 10 + [i / 100 for i in range(1, 71)])


def test_the_defaults_are_kube_schedulers() -> None:
    assert (DEFAULT_QPS, DEFAULT_BURST) == (50.0, 100)


def test_the_client_waits_before_each_request_and_the_elector_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every request through the operator's client takes a token before it leaves; the
    leader election's client takes none (a renewal queued behind a create burst would lose
    the term for the whole operator)."""
    order: list[str] = []

    class Bucket:
        def wait(self) -> float:
            order.append("wait")
            return 0.0

    def sent(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> None:
        order.append(f"{method} {url}")

    monkeypatch.setattr(k8s.ApiClient, "call_api", sent)
    api = kclient.ApiClient(limiter=Bucket())  # type: ignore[arg-type]
    api.call_api("GET", "/api/v1/pods")
    api.call_api("POST", "/api/v1/namespaces/n/pods")
    api.ungated().call_api("PUT", "/apis/coordination.k8s.io/v1/leases/x")
    assert order == [
        "wait",
        "GET /api/v1/pods",
        "wait",
        "POST /api/v1/namespaces/n/pods",
        "PUT /apis/coordination.k8s.io/v1/leases/x",
    ]
