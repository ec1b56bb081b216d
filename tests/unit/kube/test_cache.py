from torchrun_operator.api.names import LABEL_JOB_NAME as JOB_LABEL
from torchrun_operator.kube.cache import JobCache, PodCache


def pod(name: str, rv: str, uid: str = "u1", job: str = "j") -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": rv,
            "labels": {JOB_LABEL: job},
        }
    }


def test_a_late_watch_event_never_overwrites_a_newer_response() -> None:
    c = PodCache()
    c.put(pod("p", "20"))
    c.put(pod("p", "7"))
    assert c.pods(("ns", "j"))[0]["metadata"]["resourceVersion"] == "20"


def test_delete_of_an_old_incarnation_keeps_the_recreated_pod() -> None:
    c = PodCache()
    c.put(pod("p", "5", uid="new"))
    c.remove(pod("p", "4", uid="old"))
    assert [p["metadata"]["uid"] for p in c.pods(("ns", "j"))] == ["new"]
    c.remove(pod("p", "6", uid="new"))
    assert c.pods(("ns", "j")) == []


def test_relist_replaces_everything_and_reports_jobs_that_vanished() -> None:
    c = PodCache()
    c.put(pod("a", "1", job="gone"))
    touched = c.replace_all([pod("b", "2", job="kept")])
    assert touched == {("ns", "gone"), ("ns", "kept")}
    assert c.pods(("ns", "gone")) == []


def test_unlabelled_pods_are_ignored() -> None:
    c = PodCache()
    assert c.put({"metadata": {"name": "x", "namespace": "ns", "labels": {}}}) is None


def test_job_cache_keeps_the_newest() -> None:
    c = JobCache()
    c.put(
        {"metadata": {"name": "j", "namespace": "ns", "resourceVersion": "9"}, "status": {"a": 1}}
    )
    c.put({"metadata": {"name": "j", "namespace": "ns", "resourceVersion": "8"}, "status": {}})
    cached = c.get(("ns", "j"))
    assert cached is not None and cached["status"] == {"a": 1}


def test_a_relist_judges_gone_only_what_it_could_have_seen() -> None:
    from torchrun_operator.kube.cache import gone_after_relist, same_version

    old = pod("j", "5", uid="u-old")
    assert gone_after_relist(old, None, 10)  # missing, and no newer than the listing
    assert not gone_after_relist(pod("j", "50"), None, 10)  # newer than the listing
    assert not gone_after_relist(pod("j", "5"), None, None)  # no listing version: no verdict
    assert gone_after_relist(old, pod("j", "9", uid="u-new"), 10)  # re-created under its name
    assert not gone_after_relist(old, pod("j", "9", uid="u-old"), 10)
    assert same_version(old, pod("j", "5", uid="u-old"))
    assert not same_version(old, pod("j", "6", uid="u-old")) and not same_version(None, old)
