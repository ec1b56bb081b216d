"""The job watch: every event to the controller, and a re-list that says which jobs went."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jobs
from torchrun_operator.kube.cache import JobCache
from torchrun_operator.kube.jobwatch import JobWatcher


def job(name: str, uid: str, rv: str, ns: str = "ns") -> dict[str, Any]:
    return jobs.document(name, namespace=ns, uid=uid, resourceVersion=rv)


class Scripted(JobWatcher):
    """One listing, then one watch that delivers `events`, then stops."""

    def __init__(self, cache: JobCache, listing: dict[str, Any], events: list[Any]) -> None:
        self.seen: list[tuple[str, str, str]] = []
        super().__init__(None, cache, self._record)  # type: ignore[arg-type]
        self.listing, self.events = listing, events

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        self.seen.append((kind, obj["metadata"]["name"], obj["metadata"]["uid"]))
        if kind == "DELETED":
            self._cache.remove((obj["metadata"]["namespace"], obj["metadata"]["name"]))
        else:
            self._cache.put(obj)

    def _list(self) -> dict[str, Any]:
        return self.listing

    def _events(self, resource_version: str) -> Iterator[dict[str, Any]]:
        yield from self.events
        self._stop.set()
        raise RuntimeError("watch over")


def test_a_relist_hands_over_the_jobs_deleted_while_the_watch_was_down() -> None:
    cache = JobCache()
    for j in (
        job("kept", "u-kept", "3"),
        job("ghost", "u-ghost", "5"),  # deleted while the watch was down
        job("again", "u-old", "6"),  # deleted and re-created under its name
        job("newer", "u-newer", "50"),  # newer than the listing: not its to judge
    ):
        cache.put(j)
    listing = {
        "metadata": {"resourceVersion": "10"},
        "items": [job("kept", "u-kept", "3"), job("again", "u-new", "9")],
    }
    w = Scripted(cache, listing, [])
    w._run()
    deleted = sorted(name for kind, name, _ in w.seen if kind == "DELETED")
    assert deleted == ["again", "ghost"]
    assert ("DELETED", "again", "u-old") in w.seen and ("ADDED", "again", "u-new") in w.seen
    assert w.seen.index(("DELETED", "again", "u-old")) < w.seen.index(("ADDED", "again", "u-new"))
    assert cache.get(("ns", "newer")) is not None
    assert cache.get(("ns", "again"))["metadata"]["uid"] == "u-new"  # type: ignore[index]
    assert w.synced.is_set()


def test_every_watch_event_reaches_the_controller_and_bookmarks_do_not() -> None:
    events = [
        {"type": "ADDED", "raw_object": job("a", "u-a", "11")},
        {"type": "BOOKMARK", "raw_object": {"metadata": {"resourceVersion": "12"}}},
        {"type": "MODIFIED", "raw_object": job("a", "u-a", "13")},
        {"type": "DELETED", "raw_object": job("a", "u-a", "14")},
    ]
    w = Scripted(JobCache(), {"metadata": {"resourceVersion": "10"}, "items": []}, events)
    w._run()
    assert w.seen == [("ADDED", "a", "u-a"), ("MODIFIED", "a", "u-a"), ("DELETED", "a", "u-a")]
