"""kube/client.Writes: the controller's hot writes, one request each, past the generated
methods' pydantic layer, with the same URLs, auth, timeout and errors."""

import json

import pytest
from fake_transport import FakeTransport, api
from kubernetes.client.exceptions import ApiException
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube import faults
from torchrun_operator.kube.podwatch import RawWatch

HOST = "https://apiserver.test"


def test_create_posts_the_object_as_it_is_to_its_kinds_collection() -> None:
    t = FakeTransport()
    writes = kclient.Writes(api(t))
    # A field the V1Pod model does not know goes out untouched (the generated method would
    # have dropped or refused it while validating).
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"futureField": 1}}
    assert writes.create("ns", pod) == t.body
    for kind in ("Service", "ConfigMap", "NetworkPolicy"):
        writes.create("ns", {"kind": kind, "metadata": {"name": "x"}})
    assert [(s.method, s.url.removeprefix(HOST)) for s in t.sent] == [
        ("POST", "/api/v1/namespaces/ns/pods"),
        ("POST", "/api/v1/namespaces/ns/services"),
        ("POST", "/api/v1/namespaces/ns/configmaps"),
        ("POST", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies"),
    ]
    assert t.sent[0].body is pod
    assert t.sent[0].headers["Content-Type"] == "application/json"
    assert t.sent[0].timeout == kclient.REQUEST_TIMEOUT


def test_delete_pod_carries_the_uid_precondition() -> None:
    t = FakeTransport(body={"kind": "Status", "status": "Success"})
    writes = kclient.Writes(api(t))
    assert writes.delete_pod("ns", "p-0", "u1") == {"kind": "Status", "status": "Success"}
    writes.delete_pod("ns", "p-1", None)
    assert [(s.method, s.url.removeprefix(HOST), s.body) for s in t.sent] == [
        ("DELETE", "/api/v1/namespaces/ns/pods/p-0", {"preconditions": {"uid": "u1"}}),
        ("DELETE", "/api/v1/namespaces/ns/pods/p-1", None),
    ]


def test_a_forced_delete_asks_for_a_grace_period_of_0() -> None:
    t = FakeTransport(body={"kind": "Status", "status": "Success"})
    kclient.Writes(api(t)).delete_pod("ns", "p-0", "u1", force=True)
    kclient.Writes(api(t)).delete_pod("ns", "p-1", None, force=True)
    assert [s.body for s in t.sent] == [
        {"preconditions": {"uid": "u1"}, "gracePeriodSeconds": 0},
        {"gracePeriodSeconds": 0},
    ]


def test_patch_status_sends_a_json_patch_to_the_status_subresource() -> None:
    t = FakeTransport(body={"kind": "DistributedTrainingJob", "status": {"phase": "Running"}})
    writes = kclient.Writes(api(t))
    patch = [{"op": "add", "path": "/status", "value": {"phase": "Running"}}]
    got = writes.patch_status("g.example", "v1", "ns", "things", "j", patch)
    assert got["status"] == {"phase": "Running"}
    (sent,) = t.sent
    assert (sent.method, sent.url.removeprefix(HOST)) == (
        "PATCH",
        "/apis/g.example/v1/namespaces/ns/things/j/status",
    )
    assert sent.headers["Content-Type"] == "application/json-patch+json"
    assert sent.body is patch


def test_an_error_answer_raises_with_the_apiservers_status_and_words() -> None:
    refused = {"kind": "Status", "code": 409, "message": "the object has been modified"}
    t = FakeTransport(answers=[(409, refused)])
    with pytest.raises(ApiException) as e:
        kclient.Writes(api(t)).create("ns", {"kind": "Pod", "metadata": {"name": "p"}})
    assert e.value.status == 409
    assert kclient.api_message(e.value) == "the object has been modified"


def test_names_are_quoted_into_the_path() -> None:
    t = FakeTransport()
    kclient.Writes(api(t)).delete_pod("ns", "a/b", None)
    assert t.sent[0].url == f"{HOST}/api/v1/namespaces/ns/pods/a%2Fb"


def test_fault_injection_sees_the_writes() -> None:
    t = FakeTransport()
    rule = {"method": "POST", "path": "/pods$", "action": "status", "status": 500}
    injector = faults.Injector.from_config({"rules": [rule]})
    with pytest.raises(ApiException) as e:
        kclient.Writes(api(t, injector)).create("ns", {"kind": "Pod", "metadata": {"name": "p"}})
    assert e.value.status == 500
    assert t.sent == []  # refused before it reached the wire


def test_get_reads_a_child_by_name_from_its_kinds_collection() -> None:
    t = FakeTransport(body={"kind": "Service", "metadata": {"name": "j"}})
    writes = kclient.Writes(api(t))
    assert writes.get("ns", "Service", "j") == {"kind": "Service", "metadata": {"name": "j"}}
    writes.get("ns", "NetworkPolicy", "j")
    assert [(s.method, s.url.removeprefix(HOST)) for s in t.sent] == [
        ("GET", "/api/v1/namespaces/ns/services/j"),
        ("GET", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/j"),
    ]
    t = FakeTransport(answers=[(404, {"kind": "Status", "code": 404})])
    with pytest.raises(ApiException) as e:
        kclient.Writes(api(t)).get("ns", "Pod", "gone")
    assert e.value.status == 404


def test_a_lister_lists_and_watches_with_the_generated_methods_query() -> None:
    t = FakeTransport(body={"kind": "PodList", "items": []})
    list_pods = kclient.lister(api(t), kclient.collection("Pod", "ns"))
    assert list_pods(label_selector="a=b").data == b'{"kind": "PodList", "items": []}'
    kclient.lister(api(t), kclient.collection("Pod"))(
        watch=True,
        resource_version="7",
        allow_watch_bookmarks=True,
        timeout_seconds=300,
        _request_timeout=(5, 330),
    )
    jobs = kclient.custom_collection("g.example", "v1", "things", "ns")
    kclient.lister(api(t), jobs)()
    assert [(s.method, s.url.removeprefix(HOST), s.timeout) for s in t.sent] == [
        ("GET", "/api/v1/namespaces/ns/pods?labelSelector=a%3Db", kclient.REQUEST_TIMEOUT),
        (
            "GET",
            "/api/v1/pods?watch=true&resourceVersion=7&allowWatchBookmarks=true&timeoutSeconds=300",
            (5, 330),
        ),
        ("GET", "/apis/g.example/v1/namespaces/ns/things", kclient.REQUEST_TIMEOUT),
    ]
    with pytest.raises(TypeError, match="field_selector"):
        list_pods(field_selector="x")


def test_a_lister_feeds_the_raw_watch_and_raises_a_refused_list() -> None:
    pod = {"kind": "Pod", "metadata": {"name": "p", "resourceVersion": "7"}}
    t = FakeTransport(body=json.dumps({"type": "ADDED", "object": pod}).encode() + b"\n")
    watched = RawWatch().stream(kclient.lister(api(t), "/api/v1/pods"), timeout_seconds=5)
    assert [(e["type"], e["raw_object"]) for e in watched] == [("ADDED", pod)]
    t = FakeTransport(answers=[(403, {"kind": "Status", "code": 403, "message": "forbidden"})])
    with pytest.raises(ApiException) as e:
        kclient.lister(api(t), "/api/v1/pods")()
    assert e.value.status == 403
