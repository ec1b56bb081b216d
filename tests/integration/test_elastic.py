"""Elastic jobs on the real local cluster: a lost pod is replaced alone.

With `elastic: {minNodes: 2, maxNodes: 3}` torchrun runs with `--nnodes 2:3`. When one pod
(not pod 0, which hosts the rendezvous store) is deleted, the others' agents keep running and
re-rendezvous; the operator creates a replacement pod for that node rank only, which joins
them. The survivors' launcher processes are the same processes before and after (checked
from the host, hostprocs.py), and the job finishes Succeeded without a gang restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pace
import pytest
from dtj import apply, job_pods, pod_log, wait_phase
from hostprocs import launcher_pid, start_time
from kubernetes import client
from shared_dir import SharedDir
from test_restarts import (
    pod_by_index,
    rank_zero_pod,
    script_configmap,
    train_command,
    wait_training,
)

# The launchers' processes are checked from the host: the cluster's nodes must run here.
pytestmark = [pytest.mark.host_nodes, pytest.mark.usefixtures("operator")]


def elastic_doc(name: str, ckpt: SharedDir) -> dict[str, Any]:
    from test_restarts import job_doc

    doc = job_doc(
        name,
        train_command(epochs=8, step_sleep=0.4),
        nodes=3,
        ckpt=ckpt,
        elastic={"minNodes": 2, "maxNodes": 3},
        # The survivors' workers die with their peer: their agents restart them in the pod.
        torchrun={"maxRestarts": 3},
    )
    return doc


def test_lost_pod_is_replaced_alone_and_the_others_keep_their_processes(
    cluster: Any, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    name = "elastic"
    ckpt = SharedDir(cluster, kube, namespace, tmp_path / "ckpt")
    apply(kube, namespace, [script_configmap(name), elastic_doc(name, ckpt)])
    victim = wait_training(kube, namespace, name, 2, ckpt)
    survivors = {i: pod_by_index(kube, namespace, name, i) for i in (0, 1)}
    before = {}
    for i, pod in survivors.items():
        pid = launcher_pid(pod)
        assert pid is not None, f"no launcher process for {pod.metadata.name}"
        before[i] = (pid, start_time(pid))

    client.CoreV1Api(kube).delete_namespaced_pod(victim.metadata.name, namespace)
    # The replacement (a new pod for node rank 2) joins and runs workers.
    replacement = wait_training(kube, namespace, name, 2, None)
    assert replacement.metadata.name != victim.metadata.name

    for i, pod in survivors.items():
        now = pod_by_index(kube, namespace, name, i)
        assert now.metadata.uid == pod.metadata.uid, f"node rank {i}'s pod was replaced"
        pid = launcher_pid(now)
        assert pid is not None and (pid, start_time(pid)) == before[i], (
            f"node rank {i}: launcher {before[i]} is now {pid}, {pid and start_time(pid)}"
        )

    # The replacement's start and the survivors' workers' restart, then the rest of training.
    budget = pace.attempts(pods=3) + pace.train_ddp(8, 0.4)
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=budget)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 0, status
    [record] = status["restarts"]
    assert record["kind"] == "replacement" and record["index"] == 2, record
    assert record["reason"] == "PodDeleted", record
    assert status["counters"]["restarts"] == 1, status["counters"]
    pods = [r["pod"] for r in status["ranks"]]
    assert pods == [
        survivors[0].metadata.name,
        survivors[1].metadata.name,
        replacement.metadata.name,
    ], status["ranks"]
    # The survivors' agents restarted their workers in place, into a round with all three.
    for r in status["ranks"][:2]:
        assert r["phase"] == "Succeeded" and r.get("restarts", 0) >= 1, r
    log = pod_log(kube, namespace, rank_zero_pod(status))
    assert "resumed from /checkpoints/checkpoint.pt" in log, log[-3000:]
    assert "training: world_size=3" in log.split("resumed from")[-1], log[-3000:]
    uids = {p.metadata.uid for p in job_pods(kube, namespace, name)}
    assert victim.metadata.uid not in uids
