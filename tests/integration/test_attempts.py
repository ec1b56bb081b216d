"""Attempts never mix, on a real cluster (reconcile/attempts.py): a pod of an older attempt
that turns up while a later one runs is deleted, and a spec changed behind the operator's back
(a suspend, a new shape and a resume while it was down) starts a new attempt of the new shape
instead of adding pods of that shape to the running one."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jobs
import pytest
from dtj import (
    GROUP,
    JOB_LABEL,
    PLURAL,
    VERSION,
    OperatorProcess,
    apply,
    get_job,
    job_pods,
    wait_for,
    wait_phase,
)
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from torchrun_operator.api import names
from torchrun_operator.render import render_pod
from urllib3.exceptions import ProtocolError

pytestmark = pytest.mark.usefixtures("operator")

SCRIPT = "import sys, time; time.sleep(float(sys.argv[1]))\n"


def sleeper(name: str, nodes: int = 2) -> list[dict[str, Any]]:
    """A job of `nodes` pods x 1 process that sleeps an hour."""
    return jobs.scripted(
        name,
        {"job.py": SCRIPT},
        ["python", "/workspace/job.py", "3600"],
        nodes=nodes,
        nproc=1,
        image="python:3.11",
        pod={"terminationGracePeriodSeconds": 3},
        rendezvous={"joinTimeoutSeconds": 60},
        failurePolicy={"maxRestarts": 0},
    )


def patch_spec(kube: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name, {"spec": spec}
    )


def wait_ready(kube: client.ApiClient, ns: str, name: str, attempt: int) -> dict[str, Any]:
    """The job once every pod of `attempt` joined rendezvous."""

    def ready() -> dict[str, Any] | None:
        job = get_job(kube, ns, name)
        st = job.get("status") or {}
        done = jobs.condition(st, "RendezvousDone") or {}
        training = st.get("phase") == "Running" and done.get("status") == "True"
        return job if st.get("attempt") == attempt and training else None

    found: dict[str, Any] = wait_for(f"{name} attempt {attempt} training", ready, timeout=300)
    return found


def live(kube: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """The job's pods that are not being deleted, by name."""
    return {
        p.metadata.name: p for p in job_pods(kube, ns, name) if not p.metadata.deletion_timestamp
    }


@contextmanager
def pods_seen(kube: client.ApiClient, ns: str, name: str) -> Iterator[set[tuple[str, str, str]]]:
    """Every (name, attempt label, index label) a watch of the job's pods saw meanwhile."""
    seen: set[tuple[str, str, str]] = set()
    stop = threading.Event()
    w = watch.Watch()

    def run() -> None:
        core = client.CoreV1Api(kube)
        while not stop.is_set():
            try:
                for ev in w.stream(
                    core.list_namespaced_pod,
                    ns,
                    label_selector=f"{JOB_LABEL}={name}",
                    timeout_seconds=5,
                ):
                    labels = ev["object"].metadata.labels or {}
                    attempt = labels.get(names.LABEL_ATTEMPT, "")
                    index = labels.get(names.LABEL_INDEX, "")
                    seen.add((ev["object"].metadata.name, attempt, index))
                    if stop.is_set():
                        break
            except ProtocolError:
                # The apiserver ended the stream early: watch again (a new watch starts
                # with every existing pod, so none that still exists is missed).
                continue

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        w.stop()
        thread.join(timeout=30)


def test_a_pod_of_an_older_attempt_is_deleted_while_the_next_attempt_runs(
    kube: client.ApiClient, namespace: str
) -> None:
    name = "stale"
    apply(kube, namespace, sleeper(name))
    wait_ready(kube, namespace, name, attempt=0)
    patch_spec(kube, namespace, name, {"runPolicy": {"suspend": True}})
    wait_phase(kube, namespace, name, {"Suspended"}, timeout=60)
    wait_for("attempt 0's pods gone", lambda: not job_pods(kube, namespace, name), 60)
    patch_spec(kube, namespace, name, {"runPolicy": {"suspend": False}})
    before = wait_ready(kube, namespace, name, attempt=1)
    gang = {n: p.metadata.uid for n, p in live(kube, namespace, name).items()}
    assert sorted(gang) == ["stale-0-a1", "stale-1-a1"]

    # Attempt 0's pod of index 0 as the operator renders it (owned by the job, its labels,
    # attempt label 0), created now as a late create would land: it shares the hostname of
    # stale-0-a1, the rendezvous host.
    late: Any = render_pod(get_job(kube, namespace, name), 0, 0)
    assert late["metadata"]["labels"][names.LABEL_ATTEMPT] == "0"
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, late)

    def deleted() -> bool:
        try:
            pod: Any = core.read_namespaced_pod("stale-0", namespace)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return pod.metadata.deletion_timestamp is not None

    wait_for("the operator to delete attempt 0's pod", deleted, 60)
    # The running attempt is untouched: same pods, no failure counted, no restart.
    after = get_job(kube, namespace, name)["status"]
    assert after["attempt"] == 1 and after["phase"] == "Running", after
    assert after["counters"] == before["status"]["counters"]
    assert {n: p.metadata.uid for n, p in live(kube, namespace, name).items()} == gang


def test_a_spec_changed_while_the_operator_was_down_starts_a_new_attempt_of_the_new_shape(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    name = "reshape"
    apply(kube, namespace, sleeper(name, nodes=2))
    wait_ready(kube, namespace, name, attempt=0)
    with pods_seen(kube, namespace, name) as seen:
        # Suspended with a third node and resumed while the operator was down: it finds the
        # job Running in attempt 0, two pods of the old shape still running.
        operator.kill()
        try:
            patch_spec(kube, namespace, name, {"runPolicy": {"suspend": True}, "nodes": 3})
            patch_spec(kube, namespace, name, {"runPolicy": {"suspend": False}})
        finally:
            operator.start()
        job = wait_ready(kube, namespace, name, attempt=1)
        pods = live(kube, namespace, name)
    st = job["status"]
    assert st["restarts"][-1]["reason"] == "SpecChanged", st["restarts"]
    assert st["restarts"][-1]["kind"] == "suspend"
    assert st["counters"]["restarts"] == 0
    assert st["nodes"]["desired"] == 3 and st["worldSize"] == 3
    assert sorted(pods) == ["reshape-0-a1", "reshape-1-a1", "reshape-2-a1"]
    assert {p.metadata.labels[names.LABEL_ATTEMPT] for p in pods.values()} == {"1"}
    # Never a pod of the new shape in the old attempt.
    assert {(n, i) for n, a, i in seen if a == "0"} <= {("reshape-0", "0"), ("reshape-1", "1")}
