"""The controller's Kueue hook against an in-memory API: no pod before admission, the status
written before anything is done to the Workload, the flavor's node labels in the pods, and an
eviction that deletes the pods first and releases the quota only once they are gone."""

from __future__ import annotations

import copy
from typing import Any

from test_controller import Harness, make_job, running, terminated
from torchrun_operator.kube.cache import PodCache
from torchrun_operator.reconcile.admission import WorkloadAction
from torchrun_operator.render import kueue

Obj = dict[str, Any]


class FakeKueue:
    """kube/kueue.KueueClient over one Workload; records the calls into the FakeApi's log so
    that their order with the job's status write and the pod calls can be checked."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.workload: Obj | None = None
        self.flavor = {"spec": {"nodeLabels": {"pool": "a100"}}}

    def flavors(self, names: list[str]) -> dict[str, Obj]:
        return {n: self.flavor for n in names}

    def apply(self, ns: str, workload: Obj | None, action: WorkloadAction) -> Obj | None:
        self.h.api.calls.append((action.kind, "Workload"))
        if action.kind == "create":
            self.workload = copy.deepcopy(action.body)
            self.workload["metadata"].update(uid="wl-uid", resourceVersion="1")
            self.workload["status"] = {}
        elif action.kind == "delete":
            self.workload = None
        elif action.kind == "patch_status":
            assert self.workload is not None
            self.workload["status"] = copy.deepcopy(action.body)
        return copy.deepcopy(self.workload)

    def kueue_says(self, *conds: tuple[str, str, str], admission: Obj | None = None) -> None:
        """Kueue's side: the Workload's conditions (and admission) as Kueue writes them."""
        assert self.workload is not None
        status: Obj = {
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": f"{r} says Kueue"}
                for t, s, r in conds
            ]
        }
        if admission is not None:
            status["admission"] = admission
        self.workload["status"] = status
        rv = int(self.workload["metadata"]["resourceVersion"]) + 1
        self.workload["metadata"]["resourceVersion"] = str(rv)


ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [{"name": "workers", "flavors": {"cpu": "a"}}],
}
ADMITTED = (("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted"))


def harness(**spec: Any) -> tuple[Harness, FakeKueue]:
    job = make_job(**spec)
    job["metadata"]["labels"] = {kueue.QUEUE_LABEL: "q"}
    h = Harness(job)
    fake = FakeKueue(h)
    h.ctrl.kueue = fake  # type: ignore[assignment]
    original = h.sync

    def sync(advance: float = 0.0) -> None:
        # As the Workload watch would: the cache holds what the API holds.
        h.ctrl.workloads = PodCache()
        if fake.workload is not None:
            h.ctrl.workloads.put(copy.deepcopy(fake.workload))
        original(advance)

    h.sync = sync  # type: ignore[method-assign]
    return h, fake


def test_no_pod_before_admission_and_the_status_first() -> None:
    h, fake = harness()
    h.sync()
    assert h.api.pods() == {}
    assert h.status["phase"] == "Queued"
    calls = [c for c in h.api.calls if c[1] in ("status", "Workload")]
    assert calls == [("patch", "status"), ("create", "Workload")]
    assert fake.workload is not None and fake.workload["spec"]["queueName"] == "q"

    fake.kueue_says(("QuotaReserved", "False", "Pending"))
    h.sync()
    assert h.api.pods() == {}
    admitted = next(c for c in h.status["conditions"] if c["type"] == "Admitted")
    assert (admitted["status"], admitted["reason"], admitted["message"]) == (
        "False",
        "Pending",
        "Pending says Kueue",
    )

    fake.kueue_says(*ADMITTED, admission=ADMISSION)
    h.sync()
    pods = h.api.pods()
    assert set(pods) == {"job-0", "job-1"}
    for pod in pods.values():
        assert pod["spec"]["nodeSelector"] == {"pool": "a100"}
        assert pod["metadata"]["labels"][kueue.PODSET_LABEL] == "workers"


def test_eviction_deletes_the_pods_then_releases_the_quota_once_they_are_gone() -> None:
    h, fake = harness()
    h.sync()
    fake.kueue_says(*ADMITTED, admission=ADMISSION)
    h.sync()
    for name in list(h.api.pods()):
        h.api.set_pod(name, running())
    h.sync()
    assert h.status["phase"] == "Running"

    fake.kueue_says(*ADMITTED, ("Evicted", "True", "Preempted"), admission=ADMISSION)
    h.api.calls.clear()
    h.sync()
    assert h.status["phase"] == "Queued"
    assert h.api.pods() == {}
    # The pods were cached when the plan was applied: no release in this round yet.
    assert ("patch_status", "Workload") not in h.api.calls
    # Intent first: Queued is recorded before the pods are deleted.
    first = h.api.calls.index(("patch", "status"))
    deletes = [i for i, c in enumerate(h.api.calls) if c[0] == "delete"]
    assert len(deletes) == 2 and min(deletes) > first

    h.sync()  # the pod watch saw them go
    assert fake.workload is not None
    released = {c["type"]: c for c in fake.workload["status"]["conditions"]}
    assert released["QuotaReserved"]["status"] == "False"
    assert "admission" not in fake.workload["status"]
    assert h.status["counters"]["restarts"] == 0


def test_a_refused_status_write_touches_no_workload() -> None:
    h, fake = harness()
    h.api.fail = lambda verb, what: 409 if what == "status" else None
    h.sync()
    assert fake.workload is None
    assert ("create", "Workload") not in h.api.calls


def finished(fake: FakeKueue) -> bool:
    assert fake.workload is not None
    conds = fake.workload["status"].get("conditions") or []
    return any(c["type"] == "Finished" and c["status"] == "True" for c in conds)


def test_a_failed_job_finishes_its_workload_only_once_its_pods_are_gone() -> None:
    """Issue 25, item 7: Finished frees the quota; marked while the pods still ran, Kueue
    admitted the next job onto GPUs still in use."""
    h, fake = harness(runPolicy={"activeDeadlineSeconds": 10})
    h.sync()
    fake.kueue_says(*ADMITTED, admission=ADMISSION)
    h.sync()
    for name in list(h.api.pods()):
        h.api.set_pod(name, running())
    h.sync()
    assert h.status["phase"] == "Running"

    h.api.calls.clear()
    h.sync(11)  # the deadline passed: Failed, and the running pods are deleted (KeepFailed)
    assert h.status["phase"] == "Failed"
    assert len([c for c in h.api.calls if c[0] == "delete"]) == 2
    # The pods were cached (running) when the plan was applied: the quota stays held.
    assert not finished(fake)
    h.sync()  # the pod watch saw them go
    assert finished(fake)


def test_pods_kept_running_by_keepall_hold_the_quota_until_they_end() -> None:
    h, fake = harness(runPolicy={"activeDeadlineSeconds": 10, "cleanPodPolicy": "KeepAll"})
    h.sync()
    fake.kueue_says(*ADMITTED, admission=ADMISSION)
    h.sync()
    for name in list(h.api.pods()):
        h.api.set_pod(name, running())
    h.sync()
    h.sync(11)
    assert h.status["phase"] == "Failed" and set(h.api.pods()) == {"job-0", "job-1"}
    h.sync()
    assert not finished(fake)
    h.api.set_pod("job-0", terminated(137, reason="Error"))
    h.sync()
    assert not finished(fake), "job-1 still runs"
    h.api.set_pod("job-1", terminated(0))
    h.sync()
    assert finished(fake)


UNREAD = 'Could not obtain workload namespace: Namespace "ns" not found'


def test_a_workload_kueue_could_not_read_the_namespace_of_is_queued_afresh() -> None:
    """Campaign runs kueue-evict-45, -39 and -47: after an apiserver restart Kueue's cache
    missed the namespace once, and Kueue never tried the Workload again. The operator waits
    the retry period on its own clock, then replaces the Workload; one Kueue then admits."""
    h, fake = harness()
    h.sync()
    assert fake.workload is not None
    first_uid = fake.workload["metadata"]["uid"]
    fake.kueue_says(("QuotaReserved", "False", "Pending"))
    fake.workload["status"]["conditions"][0]["message"] = UNREAD
    h.api.calls.clear()
    h.sync()
    h.sync(advance=10)
    assert ("delete", "Workload") not in h.api.calls, "replaced before the retry period"
    assert h.status["phase"] == "Queued"
    # The job is woken when the period ends: nothing of Kueue's would wake it.
    due = h.ctrl.queue.due_in(("ns", "job"))
    assert due is not None and 4 < due <= 5.05, due

    h.sync(advance=5)
    assert ("delete", "Workload") in h.api.calls
    assert fake.workload is None
    h.sync()
    assert fake.workload is not None and h.api.calls[-1] == ("create", "Workload")
    fake.workload["metadata"]["uid"] = "wl-uid-2"
    assert fake.workload["metadata"]["uid"] != first_uid
    fake.kueue_says(*ADMITTED, admission=ADMISSION)
    h.sync()
    assert set(h.api.pods()) == {"job-0", "job-1"}


def test_a_workload_kueue_holds_back_for_quota_is_never_replaced() -> None:
    h, fake = harness()
    h.sync()
    fake.kueue_says(("QuotaReserved", "False", "Pending"))
    h.api.calls.clear()
    for _ in range(4):
        h.sync(advance=60)
    assert ("delete", "Workload") not in h.api.calls
    assert fake.workload is not None
