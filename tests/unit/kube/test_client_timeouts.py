"""Every request our ApiClient sends carries a client-side timeout, unless the caller set one."""

import json
from typing import Any

import pytest
from fake_transport import FakeTransport, api
from kubernetes import client, watch
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube.podwatch import RawWatch


def test_every_request_gets_the_default_timeout() -> None:
    t = FakeTransport()
    core = client.CoreV1Api(api(t))
    core.read_namespaced_pod("p", "ns")
    core.delete_namespaced_pod("p", "ns")
    assert [s.timeout for s in t.sent] == [kclient.REQUEST_TIMEOUT] * 2
    assert all(0 < x <= 60 for x in kclient.REQUEST_TIMEOUT)


def test_a_callers_own_timeout_wins() -> None:
    t = FakeTransport()
    client.CoreV1Api(api(t)).read_namespaced_pod("p", "ns", _request_timeout=(1, 2))
    assert t.sent[0].timeout == (1, 2)


def test_a_watch_gets_a_timeout_longer_than_its_server_side_one() -> None:
    t = FakeTransport(body=b"")  # an empty stream: the server ended the watch at once
    core = client.CoreV1Api(api(t))
    events = watch.Watch().stream(
        core.list_namespaced_pod,
        "ns",
        timeout_seconds=kclient.WATCH_TIMEOUT_SECONDS,
        _request_timeout=kclient.WATCH_REQUEST_TIMEOUT,
    )
    assert list(events) == []
    assert "watch=true" in t.sent[0].url
    connect, read = t.sent[0].timeout
    assert connect == kclient.CONNECT_TIMEOUT_SECONDS
    assert read > kclient.WATCH_TIMEOUT_SECONDS


def test_the_pod_watch_hands_out_the_decoded_json_without_building_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7"}}
    lines = [{"type": "ADDED", "object": pod}, {"type": "DELETED", "object": pod}]
    t = FakeTransport(body=b"".join(json.dumps(e).encode() + b"\n" for e in lines))
    core = client.CoreV1Api(api(t))
    built: list[Any] = []
    # The client's Watch builds models with an ApiClient of its own: count them all.
    monkeypatch.setattr(client.ApiClient, "deserialize", lambda *a, **kw: built.append(a))
    events = list(RawWatch().stream(core.list_namespaced_pod, "ns", timeout_seconds=5))
    assert [(e["type"], e["raw_object"]) for e in events] == [("ADDED", pod), ("DELETED", pod)]
    assert built == []  # no V1Pod was made, nor any JSON encoded again to make one
