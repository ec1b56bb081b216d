"""Every request our ApiClient sends carries a client-side timeout, unless the caller set one."""

from fake_transport import FakeTransport, api
from kubernetes import client, watch
from torchrun_operator.kube import client as kclient


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
