"""kube/gangobjects.GangObjects over the fake transport, with faults injected as the operator
meets them (kube/faults.py): a create answered 409 whose object is then gone (404) has made
nothing, so it is created again or the sync fails; it never counts as done (issue 25, item 9:
the attempt's pods started without their PodGroup)."""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from fake_transport import FakeTransport, api
from torchrun_operator.kube import faults
from torchrun_operator.kube.gangobjects import CREATE_TRIES, GangObjects, GangRefused

PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups"
STATUS = {
    "phase": "Starting",
    "scheduling": {"gang": "Coscheduling", "attempt": 0, "podGroup": "job-a0"},
}


def job() -> dict[str, Any]:
    return jobs.job(
        "job", metadata={"namespace": "ns", "uid": "job-uid"}, scheduling={"gang": "Coscheduling"}
    )


def gang(times: int | str) -> tuple[GangObjects, FakeTransport, faults.Injector]:
    """Every create of the PodGroup answered 409 and every read of it 404, `times` times
    each; the transport (the real apiserver's stand-in) answers whatever gets through."""
    transport = FakeTransport(body={"items": []})
    conflict = {"method": "POST", "path": f"{PODGROUPS}$", "status": 409, "times": times}
    gone = {"method": "GET", "path": f"{PODGROUPS}/job-a0$", "status": 404, "times": times}
    injector = faults.Injector.from_config(
        {"rules": [{**conflict, "action": "status"}, {**gone, "action": "status"}]}
    )
    return GangObjects(api(transport, injector)), transport, injector


def posts(transport: FakeTransport) -> list[str]:
    return [s.url for s in transport.sent if s.method == "POST"]


@pytest.mark.parametrize("times", [1, CREATE_TRIES - 1])
def test_a_conflict_whose_object_is_gone_creates_it_again(times: int) -> None:
    objects, transport, _ = gang(times)
    objects.sync(job(), STATUS)
    assert [u.removeprefix("https://apiserver.test") for u in posts(transport)] == [PODGROUPS]


def test_a_conflict_whose_object_stays_gone_fails_the_sync_and_is_tried_again() -> None:
    objects, transport, injector = gang("all")
    with pytest.raises(GangRefused, match="job-a0"):
        objects.sync(job(), STATUS)
    assert posts(transport) == [], "nothing was created"
    conflicts, gones = injector.rules
    assert (conflicts.seen, gones.seen) == (CREATE_TRIES, CREATE_TRIES), "within a bound"
    # Not remembered as done: the next reconcile's sync tries again.
    with pytest.raises(GangRefused):
        objects.sync(job(), STATUS)
    assert conflicts.seen == 2 * CREATE_TRIES
