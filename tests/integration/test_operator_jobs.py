"""The operator end to end: real apiserver, real process node, real torchrun."""

from __future__ import annotations

import copy
import json
from typing import Any

import pace
import pytest
from dtj import (
    JOB_LABEL,
    REPO,
    apply,
    create_job,
    get_job,
    job_pods,
    load_docs,
    one_per_node,
    wait_for,
    wait_phase,
)
from kubernetes import client
from torchrun_operator.api.names import GROUP, PLURAL, VERSION
from torchrun_operator.api.ranks import parse_ranks

pytestmark = pytest.mark.usefixtures("operator")

EXAMPLES = REPO / "examples"


def _rank_set(spec: str) -> set[int]:
    return set(parse_ranks(spec))


def _job_doc(name: str) -> dict[str, Any]:
    return next(d for d in load_docs(EXAMPLES / name) if d["kind"] == "DistributedTrainingJob")


def _keep_pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The default cleanPodPolicy removes finished pods; these tests inspect them."""
    for d in docs:
        if d["kind"] == "DistributedTrainingJob":
            d["spec"].setdefault("runPolicy", {})["cleanPodPolicy"] = "KeepAll"
    return docs


def test_cpu_example_succeeds_with_per_rank_status_and_owned_children(
    kube: client.ApiClient, namespace: str
) -> None:
    job = apply(kube, namespace, _keep_pods(load_docs(EXAMPLES / "cpu-ddp.yaml")))
    name = job["metadata"]["name"]
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["worldSize"] == 4
    ranks = status["ranks"]
    # One entry per pod index; torchrun's node ranks are c10d's (by address), in any order.
    assert [r["index"] for r in ranks] == [0, 1]
    assert sorted(r["nodeRank"] for r in ranks) == [0, 1]
    assert sorted(r["globalRanks"] for r in ranks) == ["0-1", "2-3"]
    core = client.CoreV1Api(kube)
    for r in ranks:
        assert r["exitCode"] == 0 and r["phase"] == "Succeeded"
        assert r["startedAt"] and r["finishedAt"]
        # "the right pod": the pod's own launcher report names the ranks status gives it.
        pod: Any = core.read_namespaced_pod(r["pod"], namespace)
        assert pod.spec.node_name == r["node"]
        report = json.loads(pod.status.container_statuses[0].state.terminated.message)
        assert _rank_set(r["globalRanks"]) == set(report["ranks"])
    assert status.get("startTime") and status.get("completionTime")

    uid = done["metadata"]["uid"]
    svc: Any = core.read_namespaced_service(name, namespace)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
    for obj in [svc, *job_pods(kube, namespace, name)]:
        assert [o.uid for o in obj.metadata.owner_references] == [uid]

    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )

    def children_gone() -> bool:
        svcs = core.list_namespaced_service(namespace, field_selector=f"metadata.name={name}")
        return not svcs.items and not job_pods(kube, namespace, name)

    wait_for("the job's Service and pods to be garbage-collected", children_gone, timeout=90)


def test_root_cause_names_the_rank_that_raised(kube: client.ApiClient, namespace: str) -> None:
    job = apply(kube, namespace, load_docs(EXAMPLES / "fail-rank3.yaml"))
    name = job["metadata"]["name"]
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
    status = done["status"]
    assert status["phase"] == "Failed", status
    failure = status["failure"]
    assert failure["rank"] == 3
    assert failure["exitCode"] == 1
    assert "rank 3 failed on purpose" in failure["message"]
    assert "Connection closed" not in failure["message"]
    # Where it raised: the script's line (the ConfigMap mounts it at /workspace), beside the
    # exception line of the message.
    script = next(d for d in load_docs(EXAMPLES / "fail-rank3.yaml") if d["kind"] == "ConfigMap")
    lines = script["data"]["train_ddp.py"].splitlines()
    line = 1 + next(i for i, t in enumerate(lines) if "failed on purpose" in t and "raise" in t)
    where = f"/workspace/train_ddp.py:{line} in main"
    assert failure["location"] == where
    assert f"rank 3 failed on purpose (at {where})" in failure["message"]
    # A pod whose workers never started reports no ranks; the holder of rank 3 always does.
    holder = next(
        r for r in status["ranks"] if r.get("globalRanks") and 3 in _rank_set(r["globalRanks"])
    )
    assert failure["pod"] == holder["pod"] and failure["node"] == holder["node"]
    assert failure["index"] == holder["index"] and failure["nodeRank"] == holder["nodeRank"]
    assert status.get("attempt", 0) == 0  # a user error is not retried


def test_late_rank0_pod_still_rendezvouses(kube: client.ApiClient, namespace: str) -> None:
    docs = load_docs(EXAMPLES / "cpu-ddp.yaml")
    job = next(d for d in docs if d["kind"] == "DistributedTrainingJob")
    job["metadata"]["name"] = "late-rank0"
    # Pod 0 (which hosts the rendezvous store) starts its trainer 10 s after the others. The
    # trainer's image (it has sh) rather than busybox: a cluster with no registry has it.
    job["spec"]["template"]["spec"]["initContainers"] = [
        {
            "name": "delay-rank0",
            "image": job["spec"]["template"]["spec"]["containers"][0]["image"],
            "command": ["sh", "-c", 'case "$(hostname)" in *-0) sleep 10;; esac'],
        }
    ]
    job = apply(kube, namespace, docs)
    done = wait_phase(kube, namespace, job["metadata"]["name"], {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]


def test_rendezvous_that_cannot_complete_fails_within_the_timeout(
    kube: client.ApiClient, namespace: str
) -> None:
    doc = copy.deepcopy(_job_doc("cpu-ddp.yaml"))
    docs = [
        d for d in load_docs(EXAMPLES / "cpu-ddp.yaml") if d["kind"] != "DistributedTrainingJob"
    ]
    doc["metadata"]["name"] = "never-meets"
    nodes, cpu = one_per_node(kube)
    doc["spec"]["nodes"] = nodes + 1
    # Each pod asks for more than half a node's CPUs: the last pod can never be scheduled.
    trainer = doc["spec"]["template"]["spec"]["containers"][0]
    trainer.setdefault("resources", {})["requests"] = {"cpu": cpu}
    doc["spec"].setdefault("rendezvous", {})["joinTimeoutSeconds"] = 20
    doc["spec"]["failurePolicy"] = {"maxRestarts": 0}
    apply(kube, namespace, [*docs, doc])
    # The pods that run start their launchers and workers, then wait out the join timeout.
    budget = pace.attempts(pods=nodes, nproc=2) + 20
    done = wait_phase(kube, namespace, "never-meets", {"Succeeded", "Failed"}, timeout=budget)
    status = done["status"]
    assert status["phase"] == "Failed"
    text = json.dumps(status).lower()
    assert "rendezvous" in text, status


def test_operator_restart_mid_job_creates_no_duplicates_and_keeps_status(
    kube: client.ApiClient, namespace: str, operator: Any
) -> None:
    docs = _keep_pods(load_docs(EXAMPLES / "cpu-ddp.yaml"))
    job = next(d for d in docs if d["kind"] == "DistributedTrainingJob")
    job["metadata"]["name"] = "survives-restart"
    apply(kube, namespace, docs)
    wait_for(
        "pods created",
        lambda: len(job_pods(kube, namespace, "survives-restart")) == 2,
        timeout=60,
    )
    before = get_job(kube, namespace, "survives-restart").get("status") or {}
    operator.kill()
    operator.start()
    done = wait_phase(kube, namespace, "survives-restart", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["startTime"] == before.get("startTime", done["status"]["startTime"])
    uids = {p.metadata.uid for p in job_pods(kube, namespace, "survives-restart")}
    assert len(uids) == 2, "the restarted operator created extra pods"
    events = client.CoreV1Api(kube).list_namespaced_event(
        namespace, field_selector="involvedObject.name=survives-restart"
    )
    created = [e for e in events.items if e.reason in ("PodsCreated", "Created")]
    assert len(created) <= 1, [e.message for e in created]


def test_pods_carry_the_labels_and_contract(kube: client.ApiClient, namespace: str) -> None:
    doc = copy.deepcopy(_job_doc("cpu-ddp.yaml"))
    others = [
        d for d in load_docs(EXAMPLES / "cpu-ddp.yaml") if d["kind"] != "DistributedTrainingJob"
    ]
    doc["metadata"]["name"] = "contract"
    created = create_job(kube, namespace, doc)
    for d in others:
        from kubernetes import utils

        utils.create_from_dict(kube, d, namespace=namespace)
    wait_for("pods", lambda: len(job_pods(kube, namespace, "contract")) == 2, timeout=60)
    for pod in job_pods(kube, namespace, "contract"):
        labels = pod.metadata.labels
        assert labels[JOB_LABEL] == "contract"
        assert labels["torchrun.dev/attempt"] == "0"
        i = labels["torchrun.dev/index"]
        assert labels["torchrun.dev/node-rank"] == i  # the index's deprecated name
        assert pod.spec.hostname == f"contract-{i}" and pod.spec.subdomain == "contract"
        shm = [v for v in pod.spec.volumes if v.empty_dir and v.empty_dir.medium == "Memory"]
        assert shm, "no memory-backed /dev/shm"
        args = pod.spec.containers[0].args
        assert args[args.index("--rdzv-id") + 1] == f"{created['metadata']['uid']}-0"
        assert args[args.index("--rdzv-endpoint") + 1] == "contract-0.contract:29400"
    wait_phase(kube, namespace, "contract", {"Succeeded", "Failed"})
