"""In-memory views of the objects the operator watches, keyed by job.

Both the watch streams and our own API responses feed these caches. Feeding our responses in
right away matters: without it, a reconcile that runs before the watch delivers a pod we just
created would see that pod missing and take it for a pod deleted by someone else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torchrun_operator.api.names import ANNOTATION_AVOIDED_NODES
from torchrun_operator.api.names import ANNOTATION_LAST_APPLIED as LAST_APPLIED
from torchrun_operator.api.names import LABEL_JOB_NAME as JOB_LABEL

JobKey = tuple[str, str]  # (namespace, name)
Obj = dict[str, Any]


def parse_rv(value: object) -> int | None:
    """A resourceVersion as a number; None when it is not one.

    resourceVersion is opaque by contract but is etcd's revision number in every apiserver we
    know; comparing it keeps a late watch event from overwriting a newer response."""
    try:
        return int(str(value))
    except ValueError:
        return None


def rv_of(obj: Obj) -> int | None:
    return parse_rv(obj.get("metadata", {}).get("resourceVersion", ""))


def is_newer(new: Obj, old: Obj | None) -> bool:
    if old is None:
        return True
    a, b = rv_of(new), rv_of(old)
    return a is None or b is None or a >= b


def same_version(a: Obj | None, b: Obj) -> bool:
    """Whether `b` is the very object `a` is: the same uid at the same resourceVersion."""
    if a is None or b["metadata"].get("resourceVersion") is None:
        return False
    ma, mb = a["metadata"], b["metadata"]
    return bool(
        ma.get("uid") == mb.get("uid") and ma.get("resourceVersion") == mb.get("resourceVersion")
    )


def gone_after_relist(cached: Obj, listed: Obj | None, list_rv: int | None) -> bool:
    """Whether a re-list taken at `list_rv` shows the cached object gone: the listing holds
    another uid under its name (deleted and re-created), or lacks it while the cached copy is
    no newer than the listing (a newer copy is not the listing's to judge)."""
    if listed is not None:
        return bool(listed["metadata"].get("uid") != cached["metadata"].get("uid"))
    rv = rv_of(cached)
    return rv is not None and list_rv is not None and rv <= list_rv


def slim_job(job: Obj) -> Obj:
    """The job without managedFields and kubectl's last-applied copy; the rest unchanged (a
    shallow copy: the spec and status dicts are the ones given). The operator never reads
    either, and together they repeat the spec and the status the job already holds."""
    meta = job.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if "managedFields" not in meta and LAST_APPLIED not in annotations:
        return job
    kept = {k: v for k, v in meta.items() if k != "managedFields"}
    if LAST_APPLIED in annotations:
        rest = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
        if rest:
            kept["annotations"] = rest
        else:
            kept.pop("annotations", None)
    return {**job, "metadata": kept}


class JobCache:
    """Jobs by key, slimmed (slim_job) as they are stored; a late copy never replaces a
    newer one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[JobKey, Obj] = {}

    def put(self, job: Obj) -> None:
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        job = slim_job(job)
        with self._lock:
            if is_newer(job, self._jobs.get(key)):
                self._jobs[key] = job

    def remove(self, key: JobKey) -> None:
        with self._lock:
            self._jobs.pop(key, None)

    def get(self, key: JobKey) -> Obj | None:
        with self._lock:
            return self._jobs.get(key)

    def keys(self) -> list[JobKey]:
        with self._lock:
            return list(self._jobs)


# What the operator reads of a pod (reconcile/observe.py, kube/rankmap.py, the controller's
# ownership and uid checks). A pod as the API sends it is mostly what it does not read: the
# spec (containers, env, volumes) and managedFields, several kilobytes each, times every pod.
POD_METADATA_KEPT = (
    "name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences",
    "creationTimestamp", "deletionTimestamp",
)  # fmt: skip
POD_SPEC_KEPT = ("nodeName",)
# Of the annotations, only the one the operator wrote to decide by.
POD_ANNOTATIONS_KEPT = (ANNOTATION_AVOIDED_NODES,)


def slim_pod(pod: Obj) -> Obj:
    """The parts of a pod the operator reads (metadata it decides by, the avoided-nodes
    annotation, spec.nodeName, the whole status), so a cache of thousands of pods holds what
    it needs and no more."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    out: Obj = {
        "metadata": {k: meta[k] for k in POD_METADATA_KEPT if k in meta},
        "spec": {k: spec[k] for k in POD_SPEC_KEPT if k in spec},
    }
    annotations = meta.get("annotations") or {}
    kept = {k: annotations[k] for k in POD_ANNOTATIONS_KEPT if k in annotations}
    if kept:
        out["metadata"]["annotations"] = kept
    for k in ("kind", "apiVersion", "status"):
        if k in pod:
            out[k] = pod[k]
    return out


class PodCache:
    """Objects of our jobs by job and name. `keep` trims each object as it is stored
    (slim_pod for pods); by default objects are kept whole (Workloads)."""

    def __init__(self, keep: Callable[[Obj], Obj] | None = None) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[JobKey, dict[str, Obj]] = {}
        self._keep = keep or (lambda obj: obj)

    @staticmethod
    def job_key(pod: Obj) -> JobKey | None:
        meta = pod.get("metadata", {})
        job = (meta.get("labels") or {}).get(JOB_LABEL)
        return (meta["namespace"], job) if job else None

    def put(self, pod: Obj) -> JobKey | None:
        key = self.job_key(pod)
        if key is None:
            return None
        name = pod["metadata"]["name"]
        pod = self._keep(pod)
        with self._lock:
            pods = self._by_job.setdefault(key, {})
            if is_newer(pod, pods.get(name)):
                pods[name] = pod
        return key

    def put_if_cached(self, pod: Obj) -> None:
        """Update a pod only while this incarnation (uid) is still cached: for the response to
        our own DELETE, which may arrive after the watch's DELETED event (a terminal pod is
        deleted at once). Put unconditionally, it would resurrect the pod until the next re-list."""
        key = self.job_key(pod)
        if key is None:
            return
        meta = pod["metadata"]
        with self._lock:
            old = self._by_job.get(key, {}).get(meta["name"])
            same = old is not None and old["metadata"].get("uid") == meta.get("uid")
            if same and is_newer(pod, old):
                self._by_job[key][meta["name"]] = self._keep(pod)

    def remove(self, pod: Obj) -> JobKey | None:
        key = self.job_key(pod)
        if key is None:
            return None
        with self._lock:
            pods = self._by_job.get(key, {})
            old = pods.get(pod["metadata"]["name"])
            # Only the same incarnation may be removed: a pod re-created under the same name
            # has another uid.
            if old is not None and old["metadata"].get("uid") == pod["metadata"].get("uid"):
                del pods[pod["metadata"]["name"]]
            if not pods:
                self._by_job.pop(key, None)
        return key

    def replace_all(self, pods: list[Obj]) -> set[JobKey]:
        """After a re-list: the listed pods are the truth. Returns every job touched."""
        fresh: dict[JobKey, dict[str, Obj]] = {}
        for pod in pods:
            key = self.job_key(pod)
            if key is not None:
                fresh.setdefault(key, {})[pod["metadata"]["name"]] = self._keep(pod)
        with self._lock:
            touched = set(self._by_job) | set(fresh)
            self._by_job = fresh
        return touched

    def pods(self, key: JobKey) -> list[Obj]:
        with self._lock:
            return list(self._by_job.get(key, {}).values())
