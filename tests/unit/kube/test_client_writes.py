"""kube/client.Writes: the controller's hot writes, one request each, past the generated
methods' pydantic layer, with the same URLs, auth, timeout and errors."""

import pytest
from fake_transport import FakeTransport, api
from kubernetes.client.exceptions import ApiException
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube import faults

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
