"""The response to our own DELETE must never bring back a pod the watch saw deleted."""

from torchrun_operator.api.names import LABEL_JOB_NAME as JOB_LABEL
from torchrun_operator.kube.cache import PodCache


def pod(rv: str, uid: str = "u1", deleting: bool = False) -> dict:
    meta: dict = {
        "name": "p",
        "namespace": "ns",
        "uid": uid,
        "resourceVersion": rv,
        "labels": {JOB_LABEL: "j"},
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"metadata": meta}


def test_delete_response_after_the_deleted_event_does_not_resurrect_the_pod() -> None:
    # A Failed pod is deleted at once: the watch's DELETED event can beat our response.
    c = PodCache()
    c.put(pod("5"))
    c.remove(pod("6", deleting=True))
    c.put_if_cached(pod("6", deleting=True))
    assert c.pods(("ns", "j")) == []


def test_delete_response_marks_the_cached_pod_terminating() -> None:
    c = PodCache()
    c.put(pod("5"))
    c.put_if_cached(pod("6", deleting=True))
    [cached] = c.pods(("ns", "j"))
    assert cached["metadata"]["deletionTimestamp"]
    c.remove(pod("7", deleting=True))
    assert c.pods(("ns", "j")) == []


def test_delete_response_of_an_old_incarnation_leaves_the_new_one() -> None:
    c = PodCache()
    c.put(pod("8", uid="new"))
    c.put_if_cached(pod("6", uid="old", deleting=True))
    [cached] = c.pods(("ns", "j"))
    assert cached["metadata"]["uid"] == "new" and "deletionTimestamp" not in cached["metadata"]
