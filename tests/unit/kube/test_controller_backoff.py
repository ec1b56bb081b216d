"""The worker's retries: a per-job exponential back-off (kube/workqueue.py), a Retry-After
honoured, and a status write the apiserver finds invalid said once, not every retry."""

from __future__ import annotations

import json
import logging
from typing import Any

import jobs
import pytest
import urllib3
from fake_transport import FakeTransport, api
from kubernetes.client.exceptions import ApiException
from torchrun_operator.controller import Controller
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube.workqueue import BACKOFF_MAX_SECONDS, WorkQueue

KEY = ("ns", "j")
JOB = jobs.document("j", namespace="ns", uid="u1", resourceVersion="5")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def controller(clock: Clock) -> Controller:
    ctrl = Controller(None, workers=0)  # type: ignore[arg-type]
    ctrl.queue = WorkQueue(clock=clock, jitter=lambda: 0.0)
    ctrl.active.set()
    return ctrl


def when_again(ctrl: Controller, clock: Clock) -> float:
    """Seconds from now until the key is handed out again (it is then taken)."""
    start = clock.t
    for _ in range(100_000):
        if ctrl.queue.get(timeout=0) == KEY:
            return clock.t - start
        clock.t += 0.5
    raise AssertionError("never handed out again")


def run_once(ctrl: Controller, clock: Clock, sync: Any) -> float:
    ctrl.sync = sync  # type: ignore[method-assign]
    ctrl.process(KEY)
    return when_again(ctrl, clock)


def error(status: int, headers: dict[str, str] | None = None) -> Any:
    def sync(key: Any) -> None:
        e = ApiException(status=status, reason="x")
        e.headers = headers
        raise e

    return sync


def test_a_failing_job_backs_off_exponentially_to_the_cap_and_a_success_resets_it() -> None:
    clock = Clock()
    ctrl = controller(clock)
    ctrl.queue.add(KEY)
    assert ctrl.queue.get(timeout=0) == KEY
    waits = [run_once(ctrl, clock, error(500)) for _ in range(10)]
    assert waits[:4] == [2.0, 4.0, 8.0, 16.0]  # was a flat 2 s for ever
    assert waits[-1] == BACKOFF_MAX_SECONDS
    ctrl.sync = lambda key: None  # type: ignore[method-assign]
    ctrl.process(KEY)
    assert run_once(ctrl, clock, error(500)) == 2.0


def test_a_retry_after_on_a_429_or_503_is_honoured() -> None:
    clock = Clock()
    ctrl = controller(clock)
    ctrl.queue.add(KEY)
    assert ctrl.queue.get(timeout=0) == KEY
    assert run_once(ctrl, clock, error(429, {"Retry-After": "30"})) == 30.0
    assert run_once(ctrl, clock, error(503, {"retry-after": "20"})) == 20.0
    assert run_once(ctrl, clock, error(500, {"Retry-After": "60"})) == 8.0  # only 429/503


def test_retry_after_is_read_from_the_answer_and_bounded() -> None:
    def answered(status: int, value: str | None) -> ApiException:
        e = ApiException(status=status, reason="x")
        e.headers = {"Retry-After": value} if value is not None else {}
        return e

    assert kclient.retry_after(answered(429, "7")) == 7.0
    assert kclient.retry_after(answered(503, "1e9")) == kclient.RETRY_AFTER_MAX_SECONDS
    assert kclient.retry_after(answered(503, "Wed, 21 Oct 2015 07:28:00 GMT")) is None
    assert kclient.retry_after(answered(503, "-1")) is None
    assert kclient.retry_after(answered(503, "nan")) is None
    assert kclient.retry_after(answered(503, None)) is None
    assert kclient.retry_after(answered(500, "7")) is None
    assert kclient.retry_after(ValueError()) is None


INVALID = {
    "kind": "Status",
    "code": 422,
    "reason": "Invalid",
    "message": 'DistributedTrainingJob.torchrun.dev "j" is invalid: status.ranks[0].pod: '
    "Invalid value: 7: must be a string",
    "details": {
        "causes": [
            {"reason": "FieldValueTypeInvalid", "field": "status.ranks[0].pod"},
        ]
    },
}


class Refusing(FakeTransport):
    """Refuses every status patch as invalid; answers anything else."""

    def request(self, method: str, url: str, *a: Any, **kw: Any) -> Any:
        self.answers = [(422, INVALID)] if method == "PATCH" else []
        return super().request(method, url, *a, **kw)


def test_an_invalid_status_write_is_said_once_naming_the_field_and_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    ctrl = controller(clock)
    t = Refusing(body={"kind": "Event"})
    ctrl.writes = kclient.Writes(api(t))

    def sync(key: Any) -> None:
        ctrl._patch_status(JOB, {"phase": "Running", "ranks": [{"pod": 7}]})

    ctrl.queue.add(KEY)
    assert ctrl.queue.get(timeout=0) == KEY
    with caplog.at_level(logging.INFO):
        waits = [run_once(ctrl, clock, sync) for _ in range(5)]
    ctrl._events.shutdown(wait=True)
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0]  # not resent every 2 s
    patches = [s for s in t.sent if s.method == "PATCH"]
    posted = [json.loads(json.dumps(s.body)) for s in t.sent if s.method == "POST"]
    assert len(patches) == 5
    assert [(e["reason"], e["type"]) for e in posted] == [("StatusInvalid", "Warning")]
    assert "status.ranks[0].pod" in posted[0]["message"]
    said = [r for r in caplog.records if "status.ranks[0].pod" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == said  # the retries themselves are quiet


def test_invalid_fields_come_from_the_status_causes() -> None:
    e = ApiException(status=422, reason="Invalid")
    e.body = json.dumps(INVALID)
    assert kclient.invalid_fields(e) == ["status.ranks[0].pod"]
    e.body = "not json"
    assert kclient.invalid_fields(e) == []


def test_an_apiserver_that_does_not_answer_is_one_warning_and_a_back_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A read timeout or a dropped connection (a busy or restarting control plane) is as
    transient as a 503: retried with the back-off, said in one line, never a traceback (the
    Helm install test failed on one under load)."""
    clock = Clock()
    ctrl = controller(clock)
    ctrl.queue.add(KEY)
    assert ctrl.queue.get(timeout=0) == KEY

    def timed_out(key: Any) -> None:
        raise urllib3.exceptions.ReadTimeoutError(None, "/apis", "Read timed out.")  # type: ignore[arg-type]

    def dropped(key: Any) -> None:
        raise urllib3.exceptions.ProtocolError("Connection aborted.")

    with caplog.at_level(logging.INFO):
        assert run_once(ctrl, clock, timed_out) == 2.0
        assert run_once(ctrl, clock, dropped) == 4.0
    said = [r for r in caplog.records if "API unreachable" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.WARNING]
    assert "ReadTimeoutError" in said[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records)
