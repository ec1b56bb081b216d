"""The gang objects of spec.scheduling.gang through Controller.sync against an in-memory API:
created after the status names them and before the pods, one set per attempt, the earlier
attempt's deleted by uid, someone else's never touched, a refusal shown on the job."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from test_controller import Harness, make_job, running, start, terminated

Obj = dict[str, Any]


class FakeGangApi:
    """create/get/list/delete of namespaced custom objects, keyed by (group, plural, name)."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.refuse: int | None = None
        self.n = 0

    def create_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, body: Obj, **_: Any
    ) -> SimpleNamespace:
        self.h.api.calls.append(("create", f"{body['kind']}/{body['metadata']['name']}"))
        if self.refuse is not None:
            raise ApiException(status=self.refuse, reason="refused")
        key = (group, plural, body["metadata"]["name"])
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.n += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["uid"] = f"gang-uid-{self.n}"
        self.objects[key] = stored
        return SimpleNamespace(data=json.dumps(stored).encode())

    def get_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, name: str, **_: Any
    ) -> SimpleNamespace:
        if (group, plural, name) not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        return SimpleNamespace(data=json.dumps(self.objects[(group, plural, name)]).encode())

    def list_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, label_selector: str = "", **_: Any
    ) -> SimpleNamespace:
        key, _sep, value = label_selector.partition("=")
        items = [
            o
            for (g, p, _n), o in self.objects.items()
            if g == group and p == plural and o["metadata"].get("labels", {}).get(key) == value
        ]
        return SimpleNamespace(data=json.dumps({"items": items}).encode())

    def delete_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, name: str, body: Any = None
    ) -> None:
        obj = self.objects.get((group, plural, name))
        self.h.api.calls.append(("delete", f"{plural}/{name}"))
        if obj is None:
            raise ApiException(status=404, reason="NotFound")
        if body.preconditions.uid != obj["metadata"]["uid"]:
            raise ApiException(status=409, reason="Conflict")
        del self.objects[(group, plural, name)]

    def names(self, plural: str = "podgroups") -> set[str]:
        return {n for (_, p, n) in self.objects if p == plural}


def harness(gang: str) -> tuple[Harness, FakeGangApi]:
    h = Harness(make_job(scheduling={"gang": gang}))
    fake = FakeGangApi(h)
    h.ctrl._gang.custom = fake  # type: ignore[assignment]
    return h, fake


def test_native_gang_objects_exist_before_the_pods_and_pods_name_the_podgroup() -> None:
    h, fake = harness("Native")
    start(h)
    assert h.status["scheduling"] == {"gang": "Native", "attempt": 0, "podGroup": "job-a0"}
    assert fake.names("workloads") == {"job-a0"} and fake.names() == {"job-a0"}
    calls = h.api.calls
    assert calls.index(("patch", "status")) < calls.index(("create", "Workload/job-a0"))
    assert calls.index(("create", "PodGroup/job-a0")) < calls.index(("create", "Pod/job-0"))
    for pod in h.api.pods().values():
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "job-a0"}
    group = fake.objects[("scheduling.k8s.io", "podgroups", "job-a0")]
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    assert group["metadata"]["ownerReferences"][0]["uid"] == "job-uid"


def test_a_gang_restart_replaces_the_podgroup_and_deletes_the_old_one_by_uid() -> None:
    h, fake = harness("Coscheduling")
    start(h)
    assert fake.names() == {"job-a0"}
    h.api.set_pod("job-0", running())
    h.api.set_pod("job-1", terminated(137, reason="OOMKilled"))
    for _ in range(6):
        h.sync(10)
    assert h.status["attempt"] == 1
    assert h.status["scheduling"]["podGroup"] == "job-a1"
    assert fake.names() == {"job-a1"}
    pods = h.api.pods()
    assert set(pods) == {"job-0-a1", "job-1-a1"}
    assert {p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for p in pods.values()} == {
        "job-a1"
    }


def test_someone_elses_podgroup_of_an_earlier_attempt_is_left_alone() -> None:
    h, fake = harness("Volcano")
    foreign = {
        "kind": "PodGroup",
        "metadata": {
            "name": "job-a7",
            "uid": "other",
            "labels": {"torchrun.dev/job-name": "job", "torchrun.dev/attempt": "7"},
            "ownerReferences": [{"controller": True, "uid": "another-job"}],
        },
    }
    fake.objects[("scheduling.volcano.sh", "podgroups", "job-a7")] = foreign
    start(h)
    assert fake.names() == {"job-a0", "job-a7"}
    assert ("delete", "podgroups/job-a7") not in h.api.calls


@pytest.mark.parametrize("code", [403, 404])
def test_a_refused_podgroup_blocks_the_pods_and_says_why(code: int) -> None:
    h, fake = harness("Native")
    fake.refuse = code
    h.sync()
    h.sync(0.5)  # the next reconcile shows the refusal
    assert h.api.pods() == {}, "no pod starts without its gang"
    blocked = next(c for c in h.status["conditions"] if c["type"] == "Blocked")
    assert blocked["status"] == "True"
    assert (
        f"creating Workload ns/job-a0 (scheduling.k8s.io/v1beta1) refused ({code})"
        in (blocked["message"])
    )
    fake.refuse = None
    h.ctrl._refused["job-uid"]["(gang)"] = ("", 0.0, 1)  # the back-off has passed
    h.sync(5)
    h.sync(1)
    assert set(h.api.pods()) == {"job-0", "job-1"}
    blocked = next(c for c in h.status["conditions"] if c["type"] == "Blocked")
    assert blocked["status"] == "False"


def test_no_gang_creates_no_gang_objects() -> None:
    h, fake = harness("None")
    start(h)
    assert fake.objects == {}
    assert "scheduling" not in h.status
    for pod in h.api.pods().values():
        assert "schedulingGroup" not in pod["spec"]


def test_a_refused_cleanup_list_is_shown_too() -> None:
    h, fake = harness("Volcano")

    def refuse(*a: Any, **kw: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")

    fake.list_namespaced_custom_object = refuse  # type: ignore[method-assign]
    h.sync()
    h.sync(0.5)
    blocked = next(c for c in h.status["conditions"] if c["type"] == "Blocked")
    assert (
        "cleaning up podgroups.scheduling.volcano.sh of earlier attempts refused (403)"
        in (blocked["message"])
    )
    assert h.api.pods() == {}


def test_a_podgroup_whose_name_is_taken_then_free_is_made_before_any_pod() -> None:
    """A create answered 409 whose object is gone when read back (404: a namesake being
    deleted) made nothing: it is created again, and no pod starts before it exists (issue
    25, item 9: the attempt ran without its PodGroup)."""
    h, fake = harness("Coscheduling")
    real_create = fake.create_namespaced_custom_object
    vanishing = {"left": 10**6}  # creates still answered 409 by a namesake on its way out

    def create(group: str, version: str, ns: str, plural: str, body: Obj, **kw: Any) -> Any:
        if vanishing["left"] > 0:
            vanishing["left"] -= 1
            h.api.calls.append(("create", f"{body['kind']}/{body['metadata']['name']}"))
            raise ApiException(status=409, reason="AlreadyExists")
        return real_create(group, version, ns, plural, body, **kw)

    fake.create_namespaced_custom_object = create  # type: ignore[method-assign]
    h.sync()
    h.sync(0.5)
    assert h.api.pods() == {}, "no pod starts without its gang"
    blocked = next(c for c in h.status["conditions"] if c["type"] == "Blocked")
    assert blocked["status"] == "True" and "(409) and then free (404)" in blocked["message"]

    vanishing["left"] = 1  # the namesake is gone after one more conflict
    h.ctrl._refused["job-uid"]["(gang)"] = ("", 0.0, 1)  # the back-off has passed
    h.sync(5)
    h.sync(1)
    assert fake.names() == {"job-a0"}
    assert set(h.api.pods()) == {"job-0", "job-1"}
