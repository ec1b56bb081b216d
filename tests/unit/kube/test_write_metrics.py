"""The writes' latency and their slow ends (timeout, 429, 503, 504), recorded in the one
request seam (kube/client.ApiClient.call_api) for every write the operator sends: an operator
of the cluster sees why jobs are slow."""

from __future__ import annotations

import time
from typing import Any

import pytest
import urllib3
from fake_transport import FakeTransport, api
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from torchrun_operator import metrics
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube.leader import FencedError, Gate

POD = {"kind": "Pod", "metadata": {"name": "p"}}
STATUS = {"kind": "Status", "message": "busy"}


def value(name: str, **labels: str) -> float:
    return metrics.default.registry.get_sample_value(name, labels) or 0.0


def writes_of(verb: str) -> float:
    return value("torchrun_operator_api_write_duration_seconds_count", verb=verb)


def slow(verb: str, outcome: str) -> float:
    return value("torchrun_operator_api_slow_writes_total", verb=verb, outcome=outcome)


class Slow(FakeTransport):
    """Answers after `pause` seconds; a write given up on raises as urllib3 does."""

    def __init__(self, pause: float = 0.0, time_out: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.pause, self.time_out = pause, time_out

    def request(self, method: str, url: str, *a: Any, **kw: Any) -> Any:
        got = super().request(method, url, *a, **kw)
        time.sleep(self.pause)
        if self.time_out:
            raise urllib3.exceptions.ReadTimeoutError(None, url, "Read timed out.")  # type: ignore[arg-type]
        return got


def test_each_write_is_timed_by_verb_and_its_slow_answers_counted_by_outcome() -> None:
    before = {v: writes_of(v) for v in ("post", "patch", "delete")}
    slow_before = {
        (v, o): slow(v, o) for v in ("post", "patch", "delete") for o in metrics.SLOW_OUTCOMES
    }
    answers = [(504, STATUS), (429, STATUS), (503, STATUS), (409, STATUS), (200, POD)]
    t = FakeTransport(answers=list(answers))
    w = kclient.Writes(api(t))
    for _ in range(4):
        with pytest.raises(ApiException):
            w.create("ns", POD)
    w.create("ns", POD)
    w.patch_status("g", "v1", "ns", "things", "j", [])
    w.get("ns", "Pod", "p")  # a read: neither timed here nor counted
    assert writes_of("post") - before["post"] == 5
    assert writes_of("patch") - before["patch"] == 1
    assert value("torchrun_operator_api_write_duration_seconds_count", verb="get") == 0
    grew = {k: slow(*k) - n for k, n in slow_before.items() if slow(*k) != n}
    # 409 is an answer about the object, not the apiserver's load: not slow.
    assert grew == {("post", "504"): 1, ("post", "429"): 1, ("post", "503"): 1}


def test_a_write_given_up_on_counts_as_a_timeout_and_its_wait_is_in_the_latency() -> None:
    before = (slow("delete", "timeout"), writes_of("delete"))
    total = value("torchrun_operator_api_write_duration_seconds_sum", verb="delete")
    t = Slow(pause=0.05, time_out=True)
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        kclient.Writes(api(t)).delete_pod("ns", "p", "u")
    assert slow("delete", "timeout") - before[0] == 1
    assert writes_of("delete") - before[1] == 1
    waited = value("torchrun_operator_api_write_duration_seconds_sum", verb="delete") - total
    assert waited >= 0.05


def test_the_leases_own_writes_are_timed_and_a_write_never_sent_is_not() -> None:
    before = writes_of("put"), writes_of("post")
    gated = api(FakeTransport())
    gated.gate = Gate()  # closed: the write is refused before it is sent
    with pytest.raises(FencedError):
        kclient.Writes(gated).create("ns", POD)
    lease_client = gated.ungated()
    lease_client.rest_client = gated.rest_client
    client.CoordinationV1Api(lease_client).replace_namespaced_lease("l", "ns", client.V1Lease())
    assert writes_of("put") - before[0] == 1
    assert writes_of("post") - before[1] == 0


def test_every_write_verb_and_slow_outcome_is_there_from_the_start() -> None:
    m = metrics.Metrics()
    for verb in metrics.WRITE_VERBS:
        assert (
            m.registry.get_sample_value(
                "torchrun_operator_api_write_duration_seconds_count", {"verb": verb}
            )
            == 0
        )
        for outcome in metrics.SLOW_OUTCOMES:
            labels = {"verb": verb, "outcome": outcome}
            assert (
                m.registry.get_sample_value("torchrun_operator_api_slow_writes_total", labels) == 0
            )
    assert set(metrics.SLOW_OUTCOMES) == {"timeout", *(str(c) for c in kclient.SLOW_CODES)}
