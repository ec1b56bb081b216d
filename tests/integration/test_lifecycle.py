"""Job lifecycle on a real cluster: deadline, TTL, cleanPodPolicy, suspend/resume, deletion."""

from __future__ import annotations

from typing import Any

import jobs
import pace
import pytest
from dtj import GROUP, PLURAL, VERSION, apply, get_job, job_gone, job_pods, wait_for, wait_phase
from kubernetes import client
from torchrun_operator.api import timefmt

pytestmark = pytest.mark.usefixtures("operator")

# One small script for every lifecycle test; the first argument picks what it does.
SCRIPT = """\
import os, socket, sys, time
mode, rank = sys.argv[1], int(os.environ["RANK"])
print(f"rank {rank} on {socket.gethostname()}: {mode} {sys.argv[2:]}", flush=True)
if mode == "sleep":
    time.sleep(float(sys.argv[2]))
elif mode == "fail-pod-1":
    # The pod of index 1 (hostname <job>-1) raises; the other keeps running.
    if socket.gethostname().endswith("-1"):
        raise RuntimeError("node rank 1 fails on purpose")
    time.sleep(3600)
"""


def scripted(name: str, args: list[str], nodes: int = 2, **spec: Any) -> list[dict[str, Any]]:
    """A ConfigMap with SCRIPT and a job of `nodes` pods x 1 process running it."""
    return jobs.scripted(
        name,
        {"job.py": SCRIPT},
        ["python", "/workspace/job.py", *args],
        nodes=nodes,
        nproc=1,
        image="python:3.11",
        pod={"terminationGracePeriodSeconds": 3},
        **{"rendezvous": {"joinTimeoutSeconds": 60}, "failurePolicy": {"maxRestarts": 0}, **spec},
    )


def elapsed(start: str, end: str) -> float:
    began, ended = timefmt.seconds(start), timefmt.seconds(end)
    assert began is not None and ended is not None, (start, end)
    return ended - began


def custom(kube: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube)


def patch_spec(kube: client.ApiClient, ns: str, name: str, spec: dict[str, Any]) -> None:
    custom(kube).patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": spec})


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] | None = jobs.condition(status, type_)
    assert found is not None, (type_, status.get("conditions"))
    return found


def live_pods(kube: client.ApiClient, ns: str, name: str) -> list[Any]:
    return [p for p in job_pods(kube, ns, name) if not p.metadata.deletion_timestamp]


def children(kube: client.ApiClient, ns: str, name: str) -> list[str]:
    core = client.CoreV1Api(kube)
    left = [f"pod/{p.metadata.name}" for p in job_pods(kube, ns, name)]
    if core.list_namespaced_service(ns, field_selector=f"metadata.name={name}").items:
        left.append(f"service/{name}")
    cms: Any = core.list_namespaced_config_map(ns, label_selector=f"torchrun.dev/job-name={name}")
    left += [f"configmap/{c.metadata.name}" for c in cms.items]
    net: Any = client.NetworkingV1Api(kube).list_namespaced_network_policy(
        ns, label_selector=f"torchrun.dev/job-name={name}"
    )
    left += [f"networkpolicy/{n.metadata.name}" for n in net.items]
    return left


def wait_ready(kube: client.ApiClient, ns: str, name: str, attempt: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        job = get_job(kube, ns, name)
        st = job.get("status") or {}
        done = any(
            c["type"] == "RendezvousDone" and c["status"] == "True"
            for c in st.get("conditions", [])
        )
        return job if st.get("attempt") == attempt and done else None

    result: dict[str, Any] = wait_for(f"{name} attempt {attempt} training", ready, timeout=120)
    return result


def test_active_deadline_fails_the_job_and_deletes_its_pods(
    kube: client.ApiClient, namespace: str
) -> None:
    apply(
        kube,
        namespace,
        scripted("deadline", ["sleep", "3600"], runPolicy={"activeDeadlineSeconds": 15}),
    )
    done = wait_phase(kube, namespace, "deadline", {"Succeeded", "Failed"}, timeout=120)
    status = done["status"]
    assert status["phase"] == "Failed"
    failed = cond(status, "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds (15s)" in failed["message"]
    # Fired by its timer, not by some later event: within a few seconds of the deadline.
    took = elapsed(status["startTime"], status["completionTime"])
    assert 15 <= took <= 25, (status["startTime"], status["completionTime"])
    wait_for("the pods to be deleted", lambda: not job_pods(kube, namespace, "deadline"), 60)


def test_ttl_after_finished_deletes_the_job_and_its_children(
    kube: client.ApiClient, namespace: str
) -> None:
    apply(
        kube,
        namespace,
        scripted(
            "ttl",
            ["sleep", "0"],
            runPolicy={"ttlSecondsAfterFinished": 5, "cleanPodPolicy": "KeepAll"},
        ),
    )
    done = wait_phase(kube, namespace, "ttl", {"Succeeded", "Failed"}, timeout=120)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert len(job_pods(kube, namespace, "ttl")) == 2  # KeepAll: kept until the TTL
    wait_for("the job to be deleted by its TTL", lambda: job_gone(kube, namespace, "ttl"), 60)
    wait_for(
        "pods, Service and ConfigMap garbage-collected",
        lambda: not children(kube, namespace, "ttl"),
        90,
    )


def test_clean_pod_policy_leaves_the_right_pods(kube: client.ApiClient, namespace: str) -> None:
    cases = {
        "keep-failed": ("KeepFailed", ["fail-pod-1"]),
        "keep-all": ("KeepAll", ["fail-pod-1"]),
        "delete": ("Delete", ["fail-pod-1"]),
        "keep-all-ok": ("KeepAll", ["sleep", "0"]),
    }
    for name, (policy, args) in cases.items():
        apply(kube, namespace, scripted(name, args, runPolicy={"cleanPodPolicy": policy}))
    # The four jobs run at once: all their pods' launchers start torch together.
    budget = pace.launchers(2 * len(cases), 0)
    final = {
        name: wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=budget)["status"]
        for name in cases
    }
    for name in ("keep-failed", "keep-all", "delete"):
        assert final[name]["phase"] == "Failed", final[name]
        assert final[name]["failure"]["index"] == 1, final[name]["failure"]
    assert final["keep-all-ok"]["phase"] == "Succeeded", final["keep-all-ok"]

    # The plan deletes pods before it writes the finished status: what is still live now
    # stays.
    def phases(name: str) -> dict[str, str]:
        return {p.metadata.name: p.status.phase for p in live_pods(kube, namespace, name)}

    # The failed rank's peer either still ran when the job failed (deleted under KeepFailed,
    # kept Running under KeepAll) or had ended on its own, Failed, once the failed agent
    # closed the rendezvous (the store-holding launcher ends then, docs/pod-contract.md).
    kept = phases("keep-failed")
    assert kept in ({"keep-failed-1": "Failed"}, {f"keep-failed-{i}": "Failed" for i in (0, 1)})
    all_kept = phases("keep-all")
    assert all_kept["keep-all-1"] == "Failed" and all_kept["keep-all-0"] in ("Running", "Failed")
    assert phases("delete") == {}
    assert phases("keep-all-ok") == {"keep-all-ok-0": "Succeeded", "keep-all-ok-1": "Succeeded"}
    for name in ("keep-failed", "delete"):
        wait_for(
            f"{name}: deleted pods gone",
            lambda n=name: len(job_pods(kube, namespace, n)) == len(phases(n)),
            60,
        )


def test_a_spec_made_invalid_on_a_running_job_fails_it_and_cleans_up_as_any_failure(
    kube: client.ApiClient, namespace: str
) -> None:
    """Issue 25, item 6: InvalidSpec on a running job left its pods running and ignored the
    TTL. The apiserver admits a trainer command whose torchrun flag takes its value as a
    separate token (CEL cannot tell where the script starts; docs/migrating.md), in the write
    that suspends the job (the template may change only then); the model refuses it."""
    apply(kube, namespace, scripted("turned", ["sleep", "3600"]))
    wait_phase(kube, namespace, "turned", {"Running"}, timeout=120)
    assert len(live_pods(kube, namespace, "turned")) == 2

    template = get_job(kube, namespace, "turned")["spec"]["template"]
    trainer = template["spec"]["containers"][0]
    trainer["command"] = ["torchrun", "--nproc-per-node", "1", "--nnodes", "2", "job.py"]
    trainer.pop("args", None)
    patch_spec(
        kube,
        namespace,
        "turned",
        {"template": template, "runPolicy": {"suspend": True, "ttlSecondsAfterFinished": 5}},
    )
    status = wait_phase(kube, namespace, "turned", {"Failed"}, timeout=60)["status"]
    failed = cond(status, "Failed")
    assert failed["reason"] == "InvalidSpec" and "--nnodes 2" in failed["message"], failed
    assert cond(status, "Running")["status"] == "False"
    # Its pods go per cleanPodPolicy (KeepFailed: neither ran into a failure), then the job
    # goes by its TTL.
    wait_for("the pods to be deleted", lambda: not job_pods(kube, namespace, "turned"), 60)
    wait_for("the job deleted by its TTL", lambda: job_gone(kube, namespace, "turned"), 60)


def test_suspend_deletes_pods_keeps_status_and_resume_starts_a_new_attempt(
    kube: client.ApiClient, namespace: str
) -> None:
    apply(kube, namespace, scripted("pause", ["sleep", "25"], failurePolicy={"maxRestarts": 1}))
    before = wait_ready(kube, namespace, "pause", attempt=0)["status"]

    patch_spec(kube, namespace, "pause", {"runPolicy": {"suspend": True}})
    suspended = wait_phase(kube, namespace, "pause", {"Suspended"}, timeout=60)["status"]
    wait_for("pods deleted", lambda: not job_pods(kube, namespace, "pause"), 60)
    assert cond(suspended, "Suspended")["status"] == "True"
    assert cond(suspended, "Running")["status"] == "False"
    # The status is kept: same attempt, start time, per-rank record, no budget spent.
    assert suspended["attempt"] == 0
    assert suspended["startTime"] == before["startTime"]
    assert [r["pod"] for r in suspended["ranks"]] == ["pause-0", "pause-1"]
    assert suspended["counters"]["restarts"] == 0
    assert get_job(kube, namespace, "pause")["status"]["phase"] == "Suspended"

    patch_spec(kube, namespace, "pause", {"runPolicy": {"suspend": False}})
    resumed = wait_ready(kube, namespace, "pause", attempt=1)["status"]
    assert resumed["counters"]["restarts"] == 0
    assert resumed["restarts"][-1]["kind"] == "suspend"
    assert cond(resumed, "Suspended")["status"] == "False"
    pods = live_pods(kube, namespace, "pause")
    assert sorted(p.metadata.name for p in pods) == ["pause-0-a1", "pause-1-a1"]
    assert {p.metadata.labels["torchrun.dev/attempt"] for p in pods} == {"1"}

    # Deleting a running job deletes everything it owns.
    assert children(kube, namespace, "pause")
    custom(kube).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "pause")
    wait_for("children garbage-collected", lambda: not children(kube, namespace, "pause"), 90)
