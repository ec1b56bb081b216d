"""The pod watcher's reconnects, with a scripted list and watch instead of an apiserver."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from torchrun_operator.api.names import LABEL_JOB_NAME as JOB_LABEL
from torchrun_operator.kube.backoff import (
    BACKOFF_INITIAL_SECONDS,
    BACKOFF_MAX_SECONDS,
    BACKOFF_RESET_SECONDS,
    Backoff,
)
from torchrun_operator.kube.cache import JobKey, PodCache
from torchrun_operator.kube.client import RETRY_AFTER_MAX_SECONDS
from torchrun_operator.kube.podwatch import PodWatcher


def pod(name: str, rv: str, job: str = "j") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": rv,
            "labels": {JOB_LABEL: job},
        }
    }


def listing(rv: str, *pods: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv}, "items": list(pods)}


def api_error(status: int, retry_after: str | None = None) -> ApiException:
    e = ApiException(status=status, reason="scripted")
    if retry_after is not None:
        e.headers = {"Retry-After": retry_after}
    return e


class ScriptedWatcher(PodWatcher):
    """Each list or watch call takes the next step of `script`: a listing (for a list), a
    list of events (for a watch) or an exception to raise. Stops when the script ends."""

    def __init__(self, script: list[Any]) -> None:
        self.changed: list[JobKey] = []
        super().__init__(None, PodCache(), self.changed.append)  # type: ignore[arg-type]
        self.script = script
        self.calls: list[str] = []
        self.sleeps: list[float] = []
        self.backoff = Backoff(rand=lambda: 1.0)  # no jitter: the full delay

    def _step(self, call: str) -> Any:
        self.calls.append(call)
        if not self.script:
            self._stop.set()
            raise RuntimeError("script over")
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    def _list(self) -> dict[str, Any]:
        step: dict[str, Any] = self._step("list")
        return step

    def _events(self, resource_version: str) -> Iterator[dict[str, Any]]:
        events: list[dict[str, Any]] = self._step(f"watch@{resource_version}")
        yield from events

    def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "raw_object": obj}


def test_backoff_doubles_to_its_cap_with_jitter_and_resets_after_quiet() -> None:
    t = [0.0]
    full = Backoff(clock=lambda: t[0], rand=lambda: 1.0)
    delays = [full.next() for _ in range(10)]
    assert delays[:3] == [BACKOFF_INITIAL_SECONDS, 2 * BACKOFF_INITIAL_SECONDS, 3.2]
    assert max(delays) == delays[-1] == BACKOFF_MAX_SECONDS
    t[0] = BACKOFF_RESET_SECONDS + 1
    assert full.next() == BACKOFF_INITIAL_SECONDS  # a quiet spell starts over
    half = Backoff(rand=lambda: 0.0)
    assert half.next() == BACKOFF_INITIAL_SECONDS / 2  # jitter draws from [d/2, d]
    many = Backoff(rand=lambda: 1.0)
    assert all(many.next() <= BACKOFF_MAX_SECONDS for _ in range(2000))  # no overflow


def test_failures_back_off_and_a_relist_forgets_pods_deleted_meanwhile() -> None:
    w = ScriptedWatcher(
        [
            listing("10", pod("a", "1"), pod("b", "2", job="k")),
            api_error(500),  # the watch fails
            ConnectionResetError("reset by peer"),  # so does the next list
            listing("20", pod("a", "1")),  # b was deleted while we were not watching
            [event("ADDED", pod("c", "21"))],  # then the server ends the watch
            [],
        ]
    )
    w._run()
    assert w.calls == ["list", "watch@10", "list", "list", "watch@20", "watch@21", "watch@21"]
    assert w.sleeps[:2] == [BACKOFF_INITIAL_SECONDS, 2 * BACKOFF_INITIAL_SECONDS]
    assert sorted(p["metadata"]["name"] for p in w._cache.pods(("ns", "j"))) == ["a", "c"]
    assert w._cache.pods(("ns", "k")) == []
    assert ("ns", "k") in w.changed[2:]  # the re-list told the controller b's job changed
    assert w.synced.is_set()


def test_429_waits_as_long_as_retry_after_asks_within_a_bound() -> None:
    w = ScriptedWatcher(
        [
            api_error(429, retry_after="7"),
            api_error(429, retry_after="86400"),
            api_error(429, retry_after="Wed, 21 Oct 2015 07:28:00 GMT"),  # a date: back-off
        ]
    )
    w._run()
    assert w.sleeps[:3] == [7.0, RETRY_AFTER_MAX_SECONDS, 4 * BACKOFF_INITIAL_SECONDS]


def test_410_gone_relists_at_once_but_backs_off_when_it_repeats() -> None:
    w = ScriptedWatcher(
        [
            listing("10", pod("a", "1")),
            api_error(410),
            listing("30", pod("a", "1")),
            [event("ERROR", {"code": 410, "message": "too old"})],
        ]
    )
    w._run()
    assert w.sleeps[:2] == [0.0, 2 * BACKOFF_INITIAL_SECONDS]


@pytest.mark.parametrize("failure", [api_error(503), TimeoutError("read timed out")])
def test_the_watcher_outlives_any_failure(failure: BaseException) -> None:
    w = ScriptedWatcher([failure] * 12 + [listing("5")])
    w._run()
    assert len(w.sleeps) >= 12 and max(w.sleeps) == BACKOFF_MAX_SECONDS
    assert w.synced.is_set()
