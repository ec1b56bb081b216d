"""The root cause on a loaded node (issue 45): a worker that raised can take seconds to exit
(garbage collection, atexit, NCCL teardown), longer on a node whose CPUs are busy, and a
failure elsewhere a second later must not take the blame. Real apiserver, operator and
torchrun; the pods' launchers and workers run in a CPU cgroup with a quota and busy loops
inside it (loadednode.py), and the worker that raises lingers in an atexit handler.
"""

from __future__ import annotations

import os
import signal
import textwrap
from typing import Any

import hostprocs
import jobs
import pytest
from dtj import IMAGE, REPO, SMALL, apply, get_job, job_pods, load_docs, pod_log, wait_phase
from kubernetes import client
from loadednode import LoadedNode
from localkube.testing import wait_for
from torchrun_operator.api.names import LABEL_INDEX
from torchrun_operator.api.ranks import parse_ranks

pytestmark = [pytest.mark.usefixtures("operator"), pytest.mark.timeout(600)]

# Local rank 1 of pod FAIL_INDEX raises FAIL_AFTER seconds into training and takes LINGER
# seconds to exit after its error file is written; local rank 0 of pod LATE_INDEX fails
# LATE_AFTER seconds after that (LATE: kill, SIGKILLed; raise, raises; none, does not).
SCRIPT = textwrap.dedent(
    """
    import atexit, os, signal, time
    import torch
    import torch.distributed as dist

    env = os.environ
    index, local = int(env["TORCHRUN_OPERATOR_INDEX"]), int(env["LOCAL_RANK"])
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    time.sleep(float(env["FAIL_AFTER"]))
    if index == int(env["FAIL_INDEX"]) and local == 1:
        atexit.register(time.sleep, float(env["LINGER"]))
        raise KeyError(f"rank {env['RANK']} failed first")
    if index == int(env["LATE_INDEX"]) and local == 0 and env["LATE"] != "none":
        time.sleep(float(env["LATE_AFTER"]))
        if env["LATE"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"rank {env['RANK']} failed later")
    time.sleep(300)
    """
)
# Long enough for the test to see every rank train and start the hogs before the failure.
FAIL_AFTER = 8
# Longer than any way the raiser's agent can end meanwhile: a closed rendezvous at once, a
# lost store when torch's store client gives up (about 10 s), SIGTERM.
LINGER = 60


def _job(name: str, fail_index: int, late_index: int, late: str) -> list[dict[str, Any]]:
    env = {
        "FAIL_AFTER": str(FAIL_AFTER),
        "FAIL_INDEX": str(fail_index),
        "LINGER": str(LINGER),
        "LATE_INDEX": str(late_index),
        "LATE": late,
        "LATE_AFTER": "1",
        "OMP_NUM_THREADS": "1",
    }
    return jobs.scripted(
        name,
        {"train.py": SCRIPT},
        ["python", f"{jobs.WORKSPACE}/train.py"],
        nodes=3,
        nproc=2,
        image=IMAGE,
        trainer={"resources": SMALL, "env": [{"name": k, "value": v} for k, v in env.items()]},
        pod={"terminationGracePeriodSeconds": 30},
        failurePolicy={"maxRestarts": 0},  # the blame decides the outcome, not a retry
        runPolicy={"cleanPodPolicy": "KeepAll"},
        rendezvous={"joinTimeoutSeconds": 300},
    )


def _training(kube: client.ApiClient, ns: str, name: str) -> dict[int, list[int]]:
    """Waits until every pod's launcher reported its ranks; global ranks by pod index."""

    def ranks() -> dict[int, list[int]] | None:
        status = get_job(kube, ns, name).get("status") or {}
        out = {
            int(r["index"]): list(parse_ranks(r["globalRanks"]))
            for r in status.get("ranks") or []
            if r.get("globalRanks")
        }
        return out if len(out) == 3 else None

    found: dict[int, list[int]] = wait_for(f"{name} training", ranks, 300, interval=0.5)
    return found


def _rank(by_index: dict[int, list[int]], index: int, local: int) -> int:
    return sorted(by_index[index])[local]


def _assert_named(done: dict[str, Any], rank: int, loaded: LoadedNode) -> None:
    status = done["status"]
    assert status["phase"] == "Failed", status
    failure = status["failure"]
    assert failure["rank"] == rank, failure
    assert failure["kind"] == "exception", failure
    assert f"KeyError: 'rank {rank} failed first'" in failure["message"], failure
    assert status.get("attempt", 0) == 0
    assert loaded.hog_seconds() > 0.5  # it was loaded


@pytest.mark.parametrize(
    ("fail_index", "late_index", "late"),
    [
        (1, 2, "kill"),  # raise, then a peer in another pod SIGKILLed a second later
        (1, 2, "raise"),  # raise, then a peer in another pod raises later
        (0, 1, "kill"),  # the raise in the pod that holds the rendezvous store
    ],
    ids=["peer-sigkilled", "peer-raises-later", "raise-in-store-pod"],
)
def test_the_first_failure_is_named_on_a_loaded_node(
    kube: client.ApiClient,
    namespace: str,
    loaded_node: LoadedNode,
    fail_index: int,
    late_index: int,
    late: str,
) -> None:
    name = "slow-exit"
    apply(kube, namespace, _job(name, fail_index, late_index, late))
    loaded_node.follow(lambda: job_pods(kube, namespace, name))
    by_index = _training(kube, namespace, name)
    loaded_node.hog()
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=300)
    _assert_named(done, _rank(by_index, fail_index, 1), loaded_node)


def test_sigterm_to_every_launcher_while_a_worker_is_raising(
    kube: client.ApiClient, namespace: str, loaded_node: LoadedNode
) -> None:
    """The kubelet stops every pod (a drain, a delete) while one worker's exception is on
    its way out: the job still names that exception."""
    name = "slow-exit-term"
    apply(kube, namespace, _job(name, 1, 2, "none"))
    loaded_node.follow(lambda: job_pods(kube, namespace, name))
    by_index = _training(kube, namespace, name)
    loaded_node.hog()
    pods = {int(p.metadata.labels[LABEL_INDEX]): p for p in job_pods(kube, namespace, name)}
    raiser = pods[1].metadata.name
    wait_for(
        "the error recorded",
        lambda: "failed first" in pod_log(kube, namespace, raiser) or None,
        120,
        interval=0.5,
    )
    launchers = [hostprocs.launcher_pid(p) for p in pods.values()]
    assert all(launchers), launchers
    for pid in launchers:
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=300)
    _assert_named(done, _rank(by_index, 1, 1), loaded_node)


def test_the_examples_root_cause_on_a_loaded_node(
    kube: client.ApiClient, namespace: str, loaded_node: LoadedNode
) -> None:
    """examples/fail-rank3.yaml (global rank 3 raises after two steps; the root-cause test of
    test_operator_jobs.py), its pods in the loaded cgroup from their start and the hogs on
    from the first step."""
    job = apply(kube, namespace, load_docs(REPO / "examples" / "fail-rank3.yaml"))
    name = job["metadata"]["name"]
    loaded_node.follow(lambda: job_pods(kube, namespace, name))
    wait_for(
        "the pods started",
        lambda: any(hostprocs.launcher_pid(p) for p in job_pods(kube, namespace, name)) or None,
        300,
        interval=0.5,
    )
    loaded_node.hog()
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=400)
    failure = done["status"]["failure"]
    assert (failure["rank"], failure["exitCode"]) == (3, 1), failure
    assert "rank 3 failed on purpose" in failure["message"]
    assert done["status"].get("attempt", 0) == 0
    assert loaded_node.hog_seconds() > 0.5  # it was loaded
