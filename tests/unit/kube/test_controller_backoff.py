"""The worker's retries: a per-job exponential back-off (kube/workqueue.py), a slow
apiserver's tries again within seconds (a Retry-After honoured within a bound), and a status
write the apiserver finds invalid said once, not every retry."""

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
from torchrun_operator.kube.workqueue import (
    BACKOFF_MAX_SECONDS,
    SLOW_RETRY_MAX_SECONDS,
    SLOW_RETRY_SECONDS,
    WorkQueue,
)

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


def test_a_retry_after_on_a_429_or_503_is_honoured_within_the_slow_bound() -> None:
    """A 429 or 503 is a busy apiserver, not a failure: its Retry-After is waited for, at
    most SLOW_RETRY_MAX_SECONDS, and the job's back-off is not counted (it used to wait 30 s
    and 20 s here, and the 500 after them then backed off for its third failure in a row)."""
    clock = Clock()
    ctrl = controller(clock)
    ctrl.queue.add(KEY)
    assert ctrl.queue.get(timeout=0) == KEY
    assert run_once(ctrl, clock, error(429, {"Retry-After": "7"})) == 7.0
    assert run_once(ctrl, clock, error(503, {"retry-after": "20"})) == SLOW_RETRY_MAX_SECONDS
    assert run_once(ctrl, clock, error(429)) == SLOW_RETRY_SECONDS  # none asked
    assert ctrl.queue.failures(KEY) == 0
    assert run_once(ctrl, clock, error(500, {"Retry-After": "60"})) == 2.0  # the first failure


def timed_out(key: Any) -> None:
    raise urllib3.exceptions.ReadTimeoutError(None, "/apis", "Read timed out.")  # type: ignore[arg-type]


def timed_out_wrapped(key: Any) -> None:
    # A PUT or DELETE's read timeout, as urllib3 raises it once its retries (none) are spent.
    cause = urllib3.exceptions.ReadTimeoutError(None, "/api", "Read timed out.")  # type: ignore[arg-type]
    raise urllib3.exceptions.MaxRetryError(None, "/api", cause)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "slow",
    [error(504), error(503), error(429), timed_out, timed_out_wrapped],
    ids=["504", "503", "429", "read timeout", "read timeout, wrapped"],
)
def test_a_slow_apiserver_is_tried_again_within_seconds_and_the_back_off_never_grows(
    slow: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A write that timed out or was answered 429, 503 or 504 (and a read that timed out):
    the control plane is slow, the job is not broken. Fifty such tries in a row each come
    back within SLOW_RETRY_MAX_SECONDS, never climbing the job's back-off (they used to
    double up to 300 s); said in one line each, no traceback."""
    clock = Clock()
    ctrl = controller(clock)
    ctrl.queue.add(KEY)
    assert ctrl.queue.get(timeout=0) == KEY
    with caplog.at_level(logging.INFO):
        waits = [run_once(ctrl, clock, slow) for _ in range(50)]
    assert waits == [SLOW_RETRY_SECONDS] * 50  # no jitter in this queue
    assert SLOW_RETRY_SECONDS <= SLOW_RETRY_MAX_SECONDS <= 10
    assert ctrl.queue.failures(KEY) == 0
    said = [r for r in caplog.records if "the apiserver is slow" in r.getMessage()]
    assert len(said) == 50 and all(r.exc_info is None for r in caplog.records)


def test_a_refusal_still_backs_off_and_slow_tries_between_neither_grow_nor_reset_it() -> None:
    """403 and 404 are answers about the job, not the apiserver's load: they back off as
    before; a slow try between two of them comes back within seconds and leaves the
    back-off where it was."""
    clock = Clock()
    ctrl = controller(clock)
    ctrl.queue.add(KEY)
    assert ctrl.queue.get(timeout=0) == KEY
    waits = [
        run_once(ctrl, clock, error(403)),
        run_once(ctrl, clock, error(404)),
        run_once(ctrl, clock, error(504)),
        run_once(ctrl, clock, timed_out),
        run_once(ctrl, clock, error(403)),
        run_once(ctrl, clock, error(404)),
    ]
    assert waits == [2.0, 4.0, SLOW_RETRY_SECONDS, SLOW_RETRY_SECONDS, 8.0, 16.0]
    assert ctrl.queue.failures(KEY) == 4


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


def test_an_apiserver_that_takes_no_connection_is_one_warning_and_a_back_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A dropped or refused connection, or one not accepted in time (an apiserver restarting
    or away), is retried with the back-off, said in one line, never a traceback (the Helm
    install test failed on one under load). (A read that timed out is a slow apiserver's:
    above.)"""
    clock = Clock()
    ctrl = controller(clock)
    ctrl.queue.add(KEY)
    assert ctrl.queue.get(timeout=0) == KEY

    def dropped(key: Any) -> None:
        raise urllib3.exceptions.ProtocolError("Connection aborted.")

    def no_connection(key: Any) -> None:
        raise urllib3.exceptions.ConnectTimeoutError(None, "connect timed out")

    with caplog.at_level(logging.INFO):
        assert run_once(ctrl, clock, dropped) == 2.0
        assert run_once(ctrl, clock, no_connection) == 4.0
    said = [r for r in caplog.records if "API unreachable" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.WARNING]
    assert "ProtocolError" in said[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records)
