"""Controller._apply and sync against an in-memory API: ordering (status before pods), 409 and
404 handling, ownership, and convergence when a write is refused, lost, or the operator dies
between the status write and the pod actions.

The fake API keeps one job and its pods; a `fail` hook decides per request whether it is
refused (ApiException) or applied with its response lost (a timeout after the write). The
controller's caches are fed from the fake before each sync, as its watches would.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import jobs
import pytest
import reports
from kubernetes.client.exceptions import ApiException
from torchrun_operator import metrics
from torchrun_operator.controller import Controller
from torchrun_operator.launcher import contract
from torchrun_operator.reconcile import overdue
from torchrun_operator.render.configmap import launcher_digest, packaged_launcher

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UID = "job-uid"
Obj = dict[str, Any]


class Lost(Exception):
    """The request was applied but its response never came back."""


def resp(obj: Obj) -> SimpleNamespace:
    return SimpleNamespace(data=json.dumps(obj).encode())


def make_job(nodes: int = 2, **spec: Any) -> Obj:
    return jobs.job(
        "job",
        nodes=nodes,
        nproc=1,
        image="i",
        command=["python"],
        metadata={"namespace": "ns", "uid": UID, "generation": 1, "resourceVersion": "1"},
        **{"failurePolicy": {"maxRestarts": 3, "backoffSeconds": 0}, **spec},
    )


class FakeApi:
    """CoreV1Api and CustomObjectsApi for one namespace, with fault hooks."""

    def __init__(self, job: Obj) -> None:
        self.job = job
        self.rv = 1
        self.objects: dict[tuple[str, str], Obj] = {}  # (kind, name) -> object
        self.calls: list[tuple[str, str]] = []  # (verb, what), in order
        self.forced: list[str] = []  # pods deleted with a grace period of 0
        self.dead_nodes: set[str] = set()  # spec.nodeName of pods no kubelet deletes
        self.now = T0  # the apiserver's clock (deletionTimestamp)
        self.fail: Callable[[str, str], int | str | None] = lambda verb, what: None

    def _bump(self, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def _fault(self, verb: str, what: str) -> str | None:
        self.calls.append((verb, what))
        got = self.fail(verb, what)
        if isinstance(got, int):
            raise ApiException(status=got, reason="injected")
        return got

    # -- pods, services, configmaps --
    def _create(self, kind: str, obj: Obj) -> SimpleNamespace:
        name = obj["metadata"]["name"]
        fault = self._fault("create", f"{kind}/{name}")
        if (kind, name) in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        stored = copy.deepcopy(obj)
        stored["kind"] = kind
        stored["metadata"]["uid"] = f"uid-{kind}-{name}-{self.rv}"
        if kind == "Pod":
            stored["status"] = {"phase": "Pending"}
        self._bump(stored)
        self.objects[(kind, name)] = stored
        if fault == "lost":
            raise Lost(name)
        return resp(stored)

    def _read(self, kind: str, name: str) -> SimpleNamespace:
        self._fault("get", f"{kind}/{name}")
        if (kind, name) not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        return resp(self.objects[(kind, name)])

    # -- kube/client.Writes --
    def create(self, ns: str, obj: Obj) -> Obj:
        if obj["kind"] == "Event":
            self.calls.append(("create", f"Event/{obj['reason']}"))
            return obj
        return json.loads(self._create(obj["kind"], obj).data)

    def get(self, ns: str, kind: str, name: str) -> Obj:
        got: Obj = json.loads(self._read(kind, name).data)
        return got

    def delete_pod(self, ns: str, name: str, uid: str | None, force: bool = False) -> Obj:
        self.forced += [name] if force else []
        fault = self._fault("delete", f"Pod/{name}")
        pod = self.objects.get(("Pod", name))
        if pod is None:
            raise ApiException(status=404, reason="NotFound")
        if uid is not None and uid != pod["metadata"]["uid"]:
            raise ApiException(status=409, reason="Conflict")
        if pod["spec"].get("nodeName") in self.dead_nodes and not force:
            # No kubelet confirms: the pod stays, Terminating (its grace period is 0 here),
            # at a new resourceVersion as the apiserver writes it.
            if not pod["metadata"].get("deletionTimestamp"):
                pod["metadata"]["deletionTimestamp"] = self.now.isoformat()
                self._bump(pod)
            return pod
        del self.objects[("Pod", name)]  # terminal pods go at once; enough here
        if fault == "lost":
            raise Lost(name)
        return {"kind": "Status", "status": "Success"}

    # -- the job --
    def patch_status(
        self, g: str, v: str, ns: str, plural: str, name: str, patch: list[Obj]
    ) -> Obj:
        fault = self._fault("patch", "status")
        if self.job is None:
            raise ApiException(status=404, reason="NotFound")
        for op in patch:
            if op["path"] == "/metadata/resourceVersion":
                if op["value"] != self.job["metadata"]["resourceVersion"]:
                    raise ApiException(status=409, reason="Conflict")
            elif op["path"] == "/status":
                self.job["status"] = copy.deepcopy(op["value"])
        self._bump(self.job)
        if fault == "lost":
            raise Lost("status")
        return copy.deepcopy(self.job)

    def get_namespaced_custom_object(self, g: str, v: str, ns: str, p: str, n: str) -> Obj:
        self._fault("get", "job")
        if self.job is None:
            raise ApiException(status=404, reason="NotFound")
        return copy.deepcopy(self.job)

    def delete_namespaced_custom_object(self, *a: Any, **kw: Any) -> None:
        self._fault("delete", "job")
        self.job = None  # type: ignore[assignment]

    # -- helpers for tests --
    def pods(self) -> dict[str, Obj]:
        return {n: o for (k, n), o in self.objects.items() if k == "Pod"}

    def set_pod(self, name: str, status: Obj) -> None:
        pod = self.objects[("Pod", name)]
        pod["spec"]["nodeName"] = "node-1"
        pod["status"] = status
        self._bump(pod)


def terminated(code: int, reason: str = "", message: str | None = None) -> Obj:
    term: Obj = {
        "exitCode": code,
        "reason": reason or ("Completed" if code == 0 else "Error"),
        "startedAt": "2026-01-01T00:00:01Z",
        "finishedAt": "2026-01-01T00:00:05Z",
    }
    if message is not None:
        term["message"] = message
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "containerStatuses": [{"name": "trainer", "state": {"terminated": term}}],
    }


def running(ready: bool = True) -> Obj:
    return {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [
            {"name": "trainer", "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}
        ],
    }


def user_exception(rank: int) -> str:
    """The report of a pod whose worker of global rank `rank` raised (just before it ended)."""
    failed_at = (T0 + timedelta(seconds=4)).timestamp()
    raised = reports.failure(rank, contract.KIND_EXCEPTION, failed_at, "RuntimeError: boom")
    return reports.report(contract.FAILED, [rank], [raised])


class Harness:
    """A controller over a FakeApi, with a clock the test moves."""

    def __init__(self, job: Obj) -> None:
        self.api = FakeApi(job)
        self.t = T0
        self.ctrl = self.new_controller()

    def new_controller(self) -> Controller:
        """A fresh controller, as after a restart of the operator: empty caches."""
        ctrl = Controller(None, workers=1, clock=lambda: self.t)  # type: ignore[arg-type]
        ctrl.custom = self.api  # type: ignore[assignment]
        ctrl.writes = self.api  # type: ignore[assignment]
        ctrl.active.set()
        return ctrl

    def sync(self, advance: float = 0.0) -> None:
        """One reconcile as after a watch event; an injected error is swallowed, as the
        worker does (and retried at the next sync)."""
        self.t += timedelta(seconds=advance)
        self.api.now = self.t
        if self.api.job is None:
            return
        self.ctrl.jobs.put(copy.deepcopy(self.api.job))
        self.ctrl.pods.replace_all(copy.deepcopy(list(self.api.pods().values())))
        with contextlib.suppress(ApiException, Lost):
            self.ctrl.sync(("ns", "job"))

    def crash(self) -> None:
        """SIGKILL and restart: nothing of the old controller survives."""
        self.ctrl.stop()
        self.ctrl = self.new_controller()

    @property
    def status(self) -> Obj:
        return dict(self.api.job.get("status") or {})


def wait_event(h: Harness, reason: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ("create", f"Event/{reason}") in h.api.calls:
            return True
        time.sleep(0.01)
    return False


def start(h: Harness) -> None:
    h.sync()  # children, status, then pods of attempt 0
    assert set(h.api.pods()) == {"job-0", "job-1"}, h.api.pods()


def test_status_is_written_before_pods_are_created() -> None:
    h = Harness(make_job())
    h.sync()
    verbs = [(v, w.split("/")[0]) for v, w in h.api.calls if w != "job"]
    first_pod = verbs.index(("create", "Pod"))
    assert ("patch", "status") in verbs[:first_pod]
    assert [r["phase"] for r in h.status["ranks"]] == ["Creating", "Creating"]


def test_children_launcher_is_named_by_its_hash_and_owned() -> None:
    h = Harness(make_job())
    h.sync()
    digest = launcher_digest(packaged_launcher())[:10]
    cm = h.api.objects[("ConfigMap", f"job-launcher-{digest}")]
    assert cm["metadata"]["ownerReferences"][0]["uid"] == UID
    assert cm["immutable"] is True


@pytest.mark.parametrize("fault", [422, 500, "lost", "crash"])
def test_finished_job_is_never_restarted_when_its_status_write_fails(fault: Any) -> None:
    """All pods Succeeded, cleanPodPolicy KeepFailed: the Succeeded pods are deleted only
    after phase Succeeded is recorded, so a refused or lost write cannot turn into
    PodDeleted and a restart."""
    h = Harness(make_job())
    start(h)
    for name in ("job-0", "job-1"):
        h.api.set_pod(name, terminated(0))
    if fault == "crash":
        # The write lands, then the operator dies before deleting anything.
        h.api.fail = lambda verb, what: "lost" if what == "status" else None
        h.sync(1)
        h.crash()
    else:
        h.api.fail = lambda verb, what: fault if what == "status" else None
        h.sync(1)
        h.sync(1)
    h.api.fail = lambda verb, what: None
    for _ in range(4):
        h.sync(1)
    st = h.status
    assert st["phase"] == "Succeeded", st
    assert st["counters"] == {"userFailures": 0, "infrastructureFailures": 0, "restarts": 0}
    assert "restarts" not in st and st["attempt"] == 0
    assert h.api.pods() == {}  # KeepFailed deletes the Succeeded pods, after the write


@pytest.mark.parametrize("fault", [500, "lost"])
def test_user_failure_with_delete_policy_stays_failed(fault: Any) -> None:
    h = Harness(make_job(runPolicy={"cleanPodPolicy": "Delete"}))
    start(h)
    h.api.set_pod("job-0", terminated(1, message=user_exception(1)))
    h.api.set_pod("job-1", terminated(1, message=user_exception(0)))
    h.api.fail = lambda verb, what: fault if what == "status" else None
    h.sync(1)
    h.api.fail = lambda verb, what: None
    for _ in range(3):
        h.sync(1)
    st = h.status
    assert st["phase"] == "Failed", st
    assert st["failure"]["reason"] == "Exception"
    assert st["counters"]["userFailures"] == 1 and st["counters"]["restarts"] == 0
    assert h.api.pods() == {}


def test_gang_restart_keeps_its_cause_when_the_write_is_lost() -> None:
    h = Harness(make_job())
    start(h)
    h.api.set_pod("job-0", running())
    h.api.set_pod("job-1", terminated(137, reason="OOMKilled"))
    h.api.fail = lambda verb, what: 500 if what == "status" else None
    h.sync(30)  # past the settle window
    h.sync(1)
    assert set(h.api.pods()) == {"job-0", "job-1"}, "nothing is deleted before the write"
    h.api.fail = lambda verb, what: None
    h.sync(1)
    for _ in range(4):
        h.sync(5)  # the settle window runs from the first recorded sighting
    st = h.status
    assert st["attempt"] == 1 and st["counters"]["restarts"] == 1
    assert st["failure"]["reason"] == "OOMKilled" and st["failure"]["pod"] == "job-1"
    assert [r["reason"] for r in st["restarts"]] == ["OOMKilled"]
    assert set(h.api.pods()) == {"job-0-a1", "job-1-a1"}


def test_a_pod_no_kubelet_deletes_is_deleted_by_force_and_the_gang_restarts() -> None:
    h = Harness(make_job())
    start(h)
    h.api.set_pod("job-0", running())
    h.api.set_pod("job-1", terminated(137, reason="OOMKilled"))
    h.api.pods()["job-0"]["spec"]["nodeName"] = "gone"
    h.api._bump(h.api.pods()["job-0"])
    h.api.dead_nodes.add("gone")
    h.sync(1)
    h.sync(30)  # past the settle window: the restart is decided, job-0 deleted
    assert h.status["phase"] == "Restarting"
    assert h.api.pods()["job-0"]["metadata"]["deletionTimestamp"]
    h.sync(60)
    assert set(h.api.pods()) == {"job-0"} and h.api.forced == []  # still in its grace
    h.sync(overdue.FORCE_DELETE_AFTER_SECONDS)
    assert h.api.forced == ["job-0"]
    assert wait_event(h, "PodForceDeleted")
    h.sync(1)
    assert h.status["attempt"] == 1
    assert set(h.api.pods()) == {"job-0-a1", "job-1-a1"}


def test_gang_restart_finished_from_status_after_a_crash() -> None:
    """The restart is recorded, then the operator dies before deleting a pod: the next
    operator finishes it from the status alone, counting the restart once."""
    h = Harness(make_job())
    start(h)
    h.api.set_pod("job-0", running())
    h.api.set_pod("job-1", terminated(137, reason="OOMKilled"))
    h.sync(1)  # the failure is seen and recorded
    h.api.fail = lambda verb, what: "lost" if what == "status" else None
    h.sync(30)  # past the settle window: the restart is recorded, the response lost
    h.crash()
    h.api.fail = lambda verb, what: None
    for _ in range(4):
        h.sync(1)
    st = h.status
    assert st["attempt"] == 1 and st["counters"]["restarts"] == 1, st
    assert set(h.api.pods()) == {"job-0-a1", "job-1-a1"}


def test_elastic_replacement_creates_one_pod_however_often_the_write_fails() -> None:
    h = Harness(make_job(nodes=3, elastic={"minNodes": 1, "maxNodes": 3}))
    h.sync()
    for name in ("job-0", "job-1", "job-2"):
        h.api.set_pod(name, running())
    h.sync(1)
    h.api.set_pod("job-2", terminated(137, reason="OOMKilled"))
    h.api.fail = lambda verb, what: 500 if what == "status" else None
    for _ in range(5):
        h.sync(2)
    assert set(h.api.pods()) == {"job-0", "job-1", "job-2"}, "no pod before the write"
    h.api.fail = lambda verb, what: "lost" if what == "status" else None
    for _ in range(3):
        h.sync(2)
    h.api.fail = lambda verb, what: None
    for _ in range(3):
        h.sync(2)
    assert set(h.api.pods()) == {"job-0", "job-1", "job-2", "job-2-a0r1"}
    st = h.status
    assert st["ranks"][2]["pod"] == "job-2-a0r1"
    assert st["counters"]["restarts"] == 1


def test_conflict_rereads_and_decides_again() -> None:
    """Someone wrote the job since it was read: the write is refused, the job re-read,
    and no pod is touched on the stale decision."""
    h = Harness(make_job())
    start(h)
    h.api.set_pod("job-0", terminated(0))
    h.api.set_pod("job-1", terminated(0))
    h.ctrl.jobs.put(copy.deepcopy(h.api.job))
    h.ctrl.pods.replace_all(copy.deepcopy(list(h.api.pods().values())))
    h.api.job["metadata"]["resourceVersion"] = "999"  # a write by someone else
    h.ctrl.sync(("ns", "job"))
    assert ("get", "job") in h.api.calls
    assert set(h.api.pods()) == {"job-0", "job-1"}
    cached = h.ctrl.jobs.get(("ns", "job"))
    assert cached is not None and cached["metadata"]["resourceVersion"] == "999"
    h.sync()
    assert h.status["phase"] == "Succeeded"


def test_status_404_forgets_the_job() -> None:
    h = Harness(make_job())
    h.ctrl.jobs.put(copy.deepcopy(h.api.job))
    h.api.job = None  # type: ignore[assignment]
    h.ctrl.sync(("ns", "job"))
    assert h.ctrl.jobs.get(("ns", "job")) is None
    assert h.api.pods() == {}


def test_foreign_launcher_configmap_blocks_the_job() -> None:
    """A ConfigMap someone else made under the launcher's name never runs: no pod is
    created, the job says which object is in the way, and it starts once it is gone."""
    h = Harness(make_job())
    digest = launcher_digest(packaged_launcher())[:10]
    name = f"job-launcher-{digest}"
    h.api.objects[("ConfigMap", name)] = {
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns", "uid": "evil", "resourceVersion": "1"},
        "binaryData": {"launcher.pyz": "cHJpbnQoJ3B3bmVkJyk="},  # print('pwned')
    }
    h.sync()
    h.sync(1)
    assert h.api.pods() == {}
    blocked = next(c for c in h.status["conditions"] if c["type"] == "Blocked")
    assert blocked["status"] == "True" and name in blocked["message"]
    assert wait_event(h, "ObjectInTheWay")  # events are posted from a side pool
    assert ("ConfigMap", name) in h.api.objects, "not ours: never deleted"
    del h.api.objects[("ConfigMap", name)]
    h.sync(5)
    assert set(h.api.pods()) == {"job-0", "job-1"}
    assert h.api.objects[("ConfigMap", name)]["metadata"]["ownerReferences"][0]["uid"] == UID
    blocked = next(c for c in h.status["conditions"] if c["type"] == "Blocked")
    assert blocked["status"] == "False"


def test_predecessors_service_makes_the_job_wait() -> None:
    h = Harness(make_job())
    h.api.objects[("Service", "job")] = {
        "kind": "Service",
        "metadata": {
            "name": "job",
            "uid": "old-svc",
            "resourceVersion": "1",
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [
                {"kind": "DistributedTrainingJob", "name": "job", "uid": "old", "controller": True}
            ],
        },
    }
    h.sync()
    assert h.api.pods() == {}
    blocked = next(c for c in h.status["conditions"] if c["type"] == "Blocked")
    assert "previous job of the same name" in blocked["message"]
    del h.api.objects[("Service", "job")]  # the garbage collector got to it
    h.sync(5)
    assert set(h.api.pods()) == {"job-0", "job-1"}


def test_unowned_pod_with_the_jobs_labels_is_neither_adopted_nor_deleted() -> None:
    h = Harness(make_job(nodes=1))
    h.api.objects[("Pod", "job-0")] = {
        "kind": "Pod",
        "metadata": {
            "name": "job-0",
            "uid": "hand-made",
            "resourceVersion": "1",
            "namespace": "ns",
            "labels": {"torchrun.dev/job-name": "job", "torchrun.dev/node-rank": "0",
                       "torchrun.dev/attempt": "0"},
        },
        "spec": {},
        "status": terminated(0),
    }  # fmt: skip
    for _ in range(3):
        h.sync(1)
    st = h.status
    assert st["phase"] != "Succeeded", "a pod that is not ours says nothing about the job"
    assert h.api.pods()["job-0"]["metadata"]["uid"] == "hand-made"
    assert any(c["type"] == "Blocked" and c["status"] == "True" for c in st["conditions"])


def test_ttl_delete_carries_the_uid_precondition() -> None:
    h = Harness(make_job(runPolicy={"ttlSecondsAfterFinished": 0}))
    deleted: list[Any] = []
    h.api.delete_namespaced_custom_object = lambda *a, **kw: deleted.append(kw)  # type: ignore[method-assign]
    start(h)
    for name in ("job-0", "job-1"):
        h.api.set_pod(name, terminated(0))
    h.sync(1)
    h.sync(1)
    assert deleted and deleted[0]["body"].preconditions.uid == UID


def test_a_ttl_delete_answered_409_is_tried_again() -> None:
    # Found by the fault campaign: the 409 was taken for done, and the finished job, which
    # nothing else wakes, outlived its TTL for ever.
    h = Harness(make_job(runPolicy={"ttlSecondsAfterFinished": 0}))
    start(h)
    for name in ("job-0", "job-1"):
        h.api.set_pod(name, terminated(0))
    h.api.fail = lambda verb, what: 409 if (verb, what) == ("delete", "job") else None
    raised = []
    for _ in range(3):
        h.t += timedelta(seconds=1)
        h.ctrl.jobs.put(copy.deepcopy(h.api.job))
        h.ctrl.pods.replace_all(copy.deepcopy(list(h.api.pods().values())))
        try:
            h.ctrl.sync(("ns", "job"))
        except ApiException as e:  # the worker tries again after its back-off
            raised.append(e.status)
    assert raised and set(raised) == {409} and h.api.job is not None
    h.api.fail = lambda verb, what: None
    h.sync(1)
    assert h.api.job is None


def test_refused_pod_create_is_shown_and_retried_with_backoff() -> None:
    """Pod Security or a quota says no: the job says so (condition and Warning event with the
    apiserver's words), and the create is retried later, not every two seconds in silence."""
    h = Harness(make_job())
    words = "pods forbidden: exceeded quota: gpus"
    body = json.dumps({"kind": "Status", "message": words})

    def refuse(verb: str, what: str) -> int | None:
        if verb == "create" and what.startswith("Pod/"):
            e = ApiException(status=403, reason="Forbidden")
            e.body = body
            raise e
        return None

    h.api.fail = refuse
    h.sync()
    h.sync(1)
    blocked = next(c for c in h.status["conditions"] if c["type"] == "Blocked")
    assert blocked["status"] == "True" and blocked["reason"] == "PodCreateRefused"
    assert words in blocked["message"]
    tries = sum(1 for verb, what in h.api.calls if verb == "create" and what.startswith("Pod/"))
    assert tries == 2, "one try per pod, then back-off"
    assert wait_event(h, "PodCreateRefused")
    h.api.fail = lambda verb, what: None
    h.ctrl._refused[UID] = {n: (m, 0.0, t) for n, (m, _, t) in h.ctrl._refused[UID].items()}
    h.sync(1)
    h.sync(1)
    assert set(h.api.pods()) == {"job-0", "job-1"}
    blocked = next(c for c in h.status["conditions"] if c["type"] == "Blocked")
    assert blocked["status"] == "False"


def _count(name: str, **labels: str) -> float:
    return metrics.default.registry.get_sample_value(f"torchrun_operator_{name}", labels) or 0.0


@pytest.mark.parametrize("fault", [409, 500])
def test_a_plan_is_counted_once_and_only_after_its_status_is_written(fault: int) -> None:
    """The metrics count what a plan decided once its status is written: a plan refused (a
    conflict, an error) counts nothing; the plan decided again, and written, counts once."""
    job = make_job()
    job["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    h = Harness(job)
    start(h)
    for name in ("job-0", "job-1"):
        h.api.set_pod(name, running())
    to_running = {"from_phase": "Starting", "to_phase": "Running"}
    phases = _count("phase_transitions_total", **to_running)
    timed = _count("time_to_running_seconds_count")
    h.api.fail = lambda verb, what: fault if what == "status" else None
    h.sync(1)
    assert h.status["phase"] == "Starting"
    assert _count("phase_transitions_total", **to_running) == phases
    h.api.fail = lambda verb, what: None
    for _ in range(3):
        h.sync(1)
    assert h.status["phase"] == "Running"
    assert _count("phase_transitions_total", **to_running) == phases + 1
    assert _count("time_to_running_seconds_count") == timed + 1


def test_a_cached_pods_view_is_made_once_and_a_newer_pod_gets_its_own() -> None:
    h = Harness(make_job())
    start(h)
    h.sync()
    key = ("ns", "job")
    (first, *_) = sorted(h.ctrl.pods.pods(key), key=lambda p: p["metadata"]["name"])
    view_of = h.ctrl._viewer(key)
    v = view_of(first, "trainer")
    assert view_of(first, "trainer") is v
    assert h.ctrl._viewer(key)(copy.deepcopy(first), "trainer") is v  # same uid and version
    newer = copy.deepcopy(first)
    newer["metadata"]["resourceVersion"] += "0"
    newer["status"] = {"phase": "Running"}
    assert h.ctrl._viewer(key)(newer, "trainer").phase == "Running" != v.phase


def test_only_the_views_of_a_jobs_last_reconcile_are_remembered() -> None:
    # The memo held every version of every pod it had seen (up to 8,192 pods), most of them
    # long replaced in the cache: memory that grew with the events, not with the pods.
    h = Harness(make_job())
    start(h)
    key = ("ns", "job")
    for _ in range(5):
        for name in h.api.pods():
            h.api.set_pod(name, running())  # a new resourceVersion each time
        h.sync()
    cached = h.ctrl.pods.pods(key)
    remembered = h.ctrl._views[key]
    assert len(remembered) == len(cached) > 0
    assert {rv for _, rv, _ in remembered} == {p["metadata"]["resourceVersion"] for p in cached}


def test_the_watch_echo_of_our_own_status_write_is_not_reconciled_again() -> None:
    h = Harness(make_job())
    start(h)  # the status write's answer is in the cache
    written = copy.deepcopy(h.api.job)
    cached = h.ctrl.jobs.get(("ns", "job"))
    assert cached is not None
    assert cached["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
    h.ctrl.on_job_event("MODIFIED", copy.deepcopy(written))
    assert len(h.ctrl.queue) == 0
    changed = copy.deepcopy(written)
    changed["metadata"]["resourceVersion"] = str(int(written["metadata"]["resourceVersion"]) + 1)
    h.ctrl.on_job_event("MODIFIED", changed)  # someone else's write: decided again
    assert len(h.ctrl.queue) == 1
