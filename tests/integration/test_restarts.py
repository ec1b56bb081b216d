"""Failures and gang restarts on a real cluster, with real torchrun.

A worker killed by SIGKILL, a pod deleted by someone else and a lost node are infrastructure
failures: the operator deletes the whole gang and starts a new attempt, which resumes from the
checkpoint in a shared directory and ends with bit-identical weights to an uninterrupted run.
A rank that exits 1 fails the job at once; an exit code listed as retryable restarts it; the
restart budget, counted in the job's status, survives an operator restart.

A worker is killed from the host (hostprocs: its processes found in /proc by the pod's IP),
and a node is lost by pausing a process node's heartbeats or freezing a kind node's container
(nodes.node_lost): those two tests need the cluster's nodes on this host, localkube's or
kind's (mark `host_nodes`). The others run on any cluster, the checkpoint in a directory every
pod shares (shared_dir: a hostPath of this host, on kind one every node mounts; a claim
elsewhere).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jobs
import pace
import pytest
from dtj import IMAGE, REPO, apply, get_job, job_pods, pod_log, wait_for, wait_phase
from hostprocs import launcher_pid, worker_pids
from kubernetes import client
from nodes import FAST_EVICTION, node_lost, spread, why_together, workers_usable
from shared_dir import SharedDir
from torchrun_operator.api.ranks import parse_ranks

pytestmark = pytest.mark.usefixtures("operator")

SCRIPTS = REPO / "examples" / "scripts"
# Small and slow enough to interrupt: 256 samples / (2 ranks x 16) = 8 steps an epoch.
TRAIN_ARGS = ["--samples", "256", "--batch-size", "16", "--seed", "7"]


# ---- building jobs ------------------------------------------------------------------------


def script_configmap(name: str) -> dict[str, Any]:
    files = ("train_ddp.py", "torchrun_example.py")  # the script and what it imports
    return jobs.configmap(f"{name}-script", {f: (SCRIPTS / f).read_text() for f in files})


def job_doc(
    name: str,
    command: list[str],
    *,
    nodes: int = 2,
    nproc: int = 1,
    ckpt: SharedDir | None = None,
    failure_policy: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A small CPU job; the script ConfigMap is at /workspace, `ckpt` at /checkpoints. Its
    finished pods are kept (KeepAll): the tests read their logs."""
    doc = jobs.job(
        name,
        nodes=nodes,
        nproc=nproc,
        image=IMAGE,
        command=command,
        trainer={"resources": {"requests": {"cpu": "250m", "memory": "512Mi"}}},
        pod={"terminationGracePeriodSeconds": 2, "tolerations": FAST_EVICTION},
        **{
            "rendezvous": {"joinTimeoutSeconds": 90},
            "failurePolicy": failure_policy or {"maxRestarts": 2, "backoffSeconds": 1},
            "runPolicy": {"cleanPodPolicy": "KeepAll"},
            **spec,
        },
    )
    jobs.mount(doc, {"name": "script", "configMap": {"name": f"{name}-script"}}, jobs.WORKSPACE)
    if ckpt is not None:
        jobs.mount(doc, {"name": "checkpoints", **ckpt.volume()}, "/checkpoints")
    return doc


def train_command(epochs: int, step_sleep: float) -> list[str]:
    return [
        "python",
        "/workspace/train_ddp.py",
        "--epochs",
        str(epochs),
        "--checkpoint-dir",
        "/checkpoints",
        "--step-sleep",
        str(step_sleep),
        *TRAIN_ARGS,
    ]


# ---- pods -------------------------------------------------------------------------------


def live_pods(kube: client.ApiClient, ns: str, job: str, index: int) -> list[Any]:
    return [
        p
        for p in job_pods(kube, ns, job)
        if p.metadata.labels.get("torchrun.dev/node-rank") == str(index)
        and not p.metadata.deletion_timestamp
    ]


def pod_by_index(kube: client.ApiClient, ns: str, job: str, index: int) -> Any:
    pods = live_pods(kube, ns, job, index)
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def wait_training(
    kube: client.ApiClient, ns: str, job: str, index: int, ckpt: SharedDir | None
) -> Any:
    """Once a checkpoint exists in `ckpt` (unless None) and pod `index` runs workers (its
    launcher reported the ranks it holds, read by the operator into status.ranks): the pod."""

    def ready() -> Any:
        pods = live_pods(kube, ns, job, index)
        if len(pods) != 1:
            return None
        ranks = (get_job(kube, ns, job).get("status") or {}).get("ranks") or []
        mine: dict[str, Any] = next((r for r in ranks if r.get("pod") == pods[0].metadata.name), {})
        if mine.get("phase") != "Running" or not mine.get("globalRanks"):
            return None
        if ckpt is not None and not ckpt.is_file("checkpoint.pt"):
            return None
        return pods[0]

    # The gang's start and its first epoch (the slowest step sleep here is 0.75 s).
    budget = pace.attempts(pods=get_job(kube, ns, job)["spec"]["nodes"]) + pace.train_ddp(1, 0.75)
    return wait_for(f"{job}: a checkpoint and workers in pod {index}", ready, timeout=budget)


def wait_workers(kube: client.ApiClient, ns: str, pod: Any) -> dict[int, int]:
    """Global rank -> host PID of the pod's torchrun workers, once there are any."""
    core = client.CoreV1Api(kube)

    def found() -> dict[int, int] | None:
        root = launcher_pid(core.read_namespaced_pod(pod.metadata.name, ns))
        return (worker_pids(root) if root else {}) or None

    workers: dict[int, int] = wait_for(f"workers of {pod.metadata.name}", found, timeout=60)
    return workers


def rank_zero_pod(status: dict[str, Any]) -> str:
    return pod_of_rank(status, 0)


def pod_of_rank(status: dict[str, Any], rank: int) -> str:
    """The pod that holds global `rank` (status.ranks[].globalRanks: "0", "2-3", "0,2"):
    torchrun's rendezvous, not the pod's index, decides it."""
    for r in status["ranks"]:
        if rank in parse_ranks(r.get("globalRanks") or ""):
            return str(r["pod"])
    raise AssertionError(f"no pod holds global rank {rank}: {status['ranks']}")


def final_checksum(text: str) -> str:
    found = re.findall(r"final checksum: (\w+)", text)
    assert found, f"no final checksum in:\n{text[-3000:]}"
    return found[-1]


@pytest.fixture(scope="module")
def reference_checksum(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same training, uninterrupted: 2 workers under torchrun on the host."""
    ckpt = tmp_path_factory.mktemp("reference-ckpt")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        str(SCRIPTS / "train_ddp.py"),
        "--epochs",
        str(EPOCHS),
        "--checkpoint-dir",
        str(ckpt),
        *TRAIN_ARGS,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    budget = pace.launchers(1, 2) + pace.train_ddp(EPOCHS)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=budget, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return final_checksum(done.stdout)


EPOCHS = 8


@pytest.fixture
def ckpt(cluster: Any, kube: client.ApiClient, namespace: str, tmp_path: Path) -> SharedDir:
    return SharedDir(cluster, kube, namespace, tmp_path / "ckpt")


# ---- infrastructure failures: one gang restart, resumed, same weights -----------------------


def assert_one_restart_and_resumed(
    cluster: Any,
    kube: client.ApiClient,
    ns: str,
    name: str,
    reference: str,
    *,
    index: int,
    rank: int | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    # Two attempts, and all of the training (the slowest step sleep here is 0.75 s).
    budget = pace.attempts(2) + pace.train_ddp(EPOCHS, 0.75)
    done = wait_phase(kube, ns, name, {"Succeeded", "Failed"}, timeout=budget)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 1, status
    assert status["counters"]["restarts"] == 1, status["counters"]
    assert status["counters"]["userFailures"] == 0, status["counters"]
    [record] = status["restarts"]
    assert record["attempt"] == 1 and record["kind"] == "infrastructure", record
    assert record["index"] == index, record
    if rank is not None:
        assert record["rank"] == rank, record
    if reason is not None:
        assert record["reason"] == reason, record
    # Every pod of the finished attempt is a new one (pod names carry the attempt).
    assert all(r["pod"].endswith("-a1") for r in status["ranks"]), status["ranks"]
    log = pod_log(kube, ns, rank_zero_pod(status))
    assert "resumed from /checkpoints/checkpoint.pt" in log, (status, log[-3000:])
    assert final_checksum(log) == reference
    return status


@pytest.mark.host_nodes
def test_sigkilled_worker_gang_restarts_and_resumes_from_checkpoint(
    cluster: Any, kube: client.ApiClient, namespace: str, ckpt: SharedDir, reference_checksum: str
) -> None:
    name = "killed-worker"
    doc = job_doc(name, train_command(EPOCHS, 0.3), ckpt=ckpt)
    apply(kube, namespace, [script_configmap(name), doc])
    pod = wait_training(kube, namespace, name, 1, ckpt)
    [(rank, pid)] = wait_workers(kube, namespace, pod).items()
    os.kill(pid, signal.SIGKILL)
    status = assert_one_restart_and_resumed(
        cluster, kube, namespace, name, reference_checksum, index=1, rank=rank, reason="Signal"
    )
    assert status["failure"]["rank"] == rank and status["failure"]["kind"] == "signal", status


def test_deleted_pod_gang_restarts_and_resumes_from_checkpoint(
    cluster: Any, kube: client.ApiClient, namespace: str, ckpt: SharedDir, reference_checksum: str
) -> None:
    name = "deleted-pod"
    doc = job_doc(name, train_command(EPOCHS, 0.3), ckpt=ckpt)
    apply(kube, namespace, [script_configmap(name), doc])
    pod = wait_training(kube, namespace, name, 1, ckpt)
    client.CoreV1Api(kube).delete_namespaced_pod(pod.metadata.name, namespace)
    assert_one_restart_and_resumed(
        cluster, kube, namespace, name, reference_checksum, index=1, reason="PodDeleted"
    )


@pytest.mark.host_nodes
def test_lost_node_gang_restarts_and_resumes_from_checkpoint(
    cluster: Any, kube: client.ApiClient, namespace: str, ckpt: SharedDir, reference_checksum: str
) -> None:
    name = "lost-node"
    assert ckpt.spans_nodes, "the checkpoint directory must be shared across nodes"
    # The node goes NotReady 20-25 s after its heartbeats stop (the node monitor's grace
    # period), its pods are evicted 2 s later: what is left of training after the first
    # checkpoint (at least 7 x 8 x 0.75 s) lasts longer.
    doc = job_doc(name, train_command(EPOCHS, 0.75), ckpt=ckpt)
    # One pod per node while both nodes are up; the new gang fits on the surviving one.
    doc["spec"]["template"]["spec"]["affinity"] = spread(name)
    workers_usable(kube)
    apply(kube, namespace, [script_configmap(name), doc])
    pod = wait_training(kube, namespace, name, 1, ckpt)
    node = pod.spec.node_name
    other = pod_by_index(kube, namespace, name, 0).spec.node_name
    assert node != other, "both pods on one node: losing it would not be losing one rank\n" + (
        why_together(kube, namespace, name)
    )
    with node_lost(cluster, kube, node, ready_timeout=60):
        status = assert_one_restart_and_resumed(
            cluster, kube, namespace, name, reference_checksum, index=1
        )
        # The new gang ran on the node that still answered.
        assert {r["node"] for r in status["ranks"]} == {other}, status["ranks"]


# ---- exit codes and the budget ------------------------------------------------------------


def exit_command(code: int, first_attempt_only: bool = False) -> list[str]:
    """Global rank 1 exits `code` (in the job's first attempt only, if asked: torchrun gives
    the workers the rendezvous id, `<job uid>-<attempt>`, as TORCHELASTIC_RUN_ID); others
    exit 0."""
    body = (
        "import os, sys\n"
        "attempt = os.environ['TORCHELASTIC_RUN_ID'].rsplit('-', 1)[1]\n"
        "print(f'attempt {attempt} rank {os.environ[\"RANK\"]}', flush=True)\n"
        "if os.environ['RANK'] != '1':\n"
        "    sys.exit(0)\n"
        f"if {first_attempt_only!r} and attempt != '0':\n"
        "    sys.exit(0)\n"
        f"print('rank 1 exits {code}', flush=True)\n"
        f"sys.exit({code})\n"
    )
    return ["python", "-c", body]


def test_rank_exiting_1_fails_the_job_without_restart(
    kube: client.ApiClient, namespace: str
) -> None:
    name = "exits-one"
    apply(kube, namespace, [script_configmap(name), job_doc(name, exit_command(1))])
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=pace.attempts())
    status = done["status"]
    assert status["phase"] == "Failed", status
    assert status["attempt"] == 0 and not status.get("restarts"), status
    assert status["counters"] == {"userFailures": 1, "infrastructureFailures": 0, "restarts": 0}
    assert status["failure"]["rank"] == 1 and status["failure"]["exitCode"] == 1, status


def test_retryable_exit_code_restarts_the_gang(kube: client.ApiClient, namespace: str) -> None:
    name = "exits-retryable"
    policy = {"maxRestarts": 2, "backoffSeconds": 1, "retryableExitCodes": [42]}
    doc = job_doc(name, exit_command(42, first_attempt_only=True), failure_policy=policy)
    apply(kube, namespace, [script_configmap(name), doc])
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=pace.attempts(2))
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 1, status
    # The second attempt's rank 1 ran, and did not exit 42.
    log = pod_log(kube, namespace, pod_of_rank(status, 1), container="trainer")
    lines = log.splitlines()  # (the launcher's log line of the command holds its text too)
    assert "attempt 1 rank 1" in lines and "rank 1 exits 42" not in lines, log[-2000:]
    [record] = status["restarts"]
    assert record["rank"] == 1 and record["reason"] == "NonZeroExit", record
    assert status["failure"]["exitCode"] == 42, status["failure"]
    assert status["counters"]["restarts"] == 1


def test_restart_budget_runs_out_across_an_operator_restart(
    kube: client.ApiClient, namespace: str, operator: Any
) -> None:
    name = "budget"
    policy = {"maxRestarts": 2, "backoffSeconds": 1, "retryableExitCodes": [42]}
    apply(
        kube,
        namespace,
        [script_configmap(name), job_doc(name, exit_command(42), failure_policy=policy)],
    )
    wait_for(
        "the first gang restart",
        lambda: (get_job(kube, namespace, name).get("status") or {}).get("attempt") == 1,
        timeout=pace.attempts(),
    )
    operator.kill()
    operator.start()
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=pace.attempts(2))
    status = done["status"]
    assert status["phase"] == "Failed", status
    # Had the restarted operator forgotten the first restart, a fourth attempt would run.
    assert status["attempt"] == 2, status
    assert status["counters"]["restarts"] == 2, status["counters"]
    assert [r["attempt"] for r in status["restarts"]] == [1, 2]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "RestartBudgetExhausted", failed
    assert "maxRestarts (2) spent" in failed["message"], failed
    assert status["failure"]["exitCode"] == 42
