"""The checkpoint contract on a real cluster, with examples/checkpoint.yaml's script: rank 0
saves to spec.checkpoint's storage and reports it, status.lastCheckpoint shows it; a pod
killed mid-run restarts the gang, and the step sequence proves the next attempt started from
the last reported checkpoint, not from step 0. The storage is a directory every pod shares
(shared_dir: a hostPath on the local cluster, a claim elsewhere)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pace
import pytest
from dtj import REPO, SMALL, apply, get_job, job_pods, load_docs, wait_for, wait_phase
from kubernetes import client
from shared_dir import SharedDir

pytestmark = pytest.mark.usefixtures("operator")

# 80 steps of 0.3 s: the job must still run after the operator reports step 10 and the pod is
# killed (with 40, in the fresh root, it finished before the report reached the test).
STEPS, SAVE_EVERY = 80, 5
# examples/checkpoint.yaml's spec.nodes: one pod per node and attempt.
NODES = 2


def checkpoint_job(name: str, ckpt: SharedDir) -> list[dict[str, Any]]:
    cm, job = load_docs(REPO / "examples" / "checkpoint.yaml")
    cm["metadata"]["name"] = f"{name}-script"
    job["metadata"]["name"] = name
    spec = job["spec"]
    spec["nprocPerNode"] = 1
    assert spec["nodes"] == NODES, spec["nodes"]
    spec["rendezvous"]["joinTimeoutSeconds"] = 120
    spec["failurePolicy"] = {"maxRestarts": 2, "backoffSeconds": 1}
    spec["checkpoint"] = {"volume": ckpt.volume(), "mountPath": "/checkpoints"}
    pod = spec["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 2
    pod["volumes"][0]["configMap"]["name"] = cm["metadata"]["name"]
    trainer = pod["containers"][0]
    trainer["resources"] = SMALL
    trainer["args"] = [
        *("--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--step-sleep", "0.3"),
        *("--step-log", "/checkpoints/steps.log"),
    ]
    return [cm, job]


def attempts(log: str) -> list[list[int]]:
    """The steps rank 0 trained, per start ("start <step>" opens one): [start, steps...]."""
    out: list[list[int]] = []
    for line in log.split():
        if line == "start":
            out.append([])
        else:
            out[-1].append(int(line))
    return out


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}


def test_a_pod_killed_mid_run_resumes_from_the_last_checkpoint(
    cluster: Any, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    ckpt = SharedDir(cluster, kube, namespace, tmp_path / "ckpt")
    name = "ckpt-resume"
    apply(kube, namespace, checkpoint_job(name, ckpt))

    def checkpointed() -> dict[str, Any] | None:
        status = get_job(kube, namespace, name).get("status") or {}
        assert status.get("phase") not in ("Succeeded", "Failed"), status.get("failure")
        last = status.get("lastCheckpoint") or {}
        return status if last.get("step", 0) >= 2 * SAVE_EVERY else None

    # The gang's start (pace), then ten steps of 0.3 s.
    budget = pace.attempts(pods=NODES) + 2 * SAVE_EVERY * 0.3
    status = wait_for("a reported checkpoint at step 10 or later", checkpointed, timeout=budget)
    seen = status["lastCheckpoint"]
    # The first attempt's own file, and its completion marker (docs/progress.md).
    assert seen["path"] == f"/checkpoints/step-{seen['step']}.a0.pt", seen
    assert ckpt.is_file(f"step-{seen['step']}.a0.pt")
    assert ckpt.is_file(f"step-{seen['step']}.a0.pt.complete")
    # Every pod has the storage's path; none of the first attempt had anything to resume.
    for pod in job_pods(kube, namespace, name):
        env = env_of(pod)
        assert env["TORCHRUN_OPERATOR_CHECKPOINT_DIR"] == "/checkpoints"
        assert "TORCHRUN_OPERATOR_RESUME_FROM" not in env

    # Kill pod 1 outright (no grace: no save on SIGTERM), mid-run.
    victim = next(p for p in job_pods(kube, namespace, name) if p.metadata.name == f"{name}-1")
    client.CoreV1Api(kube).delete_namespaced_pod(
        victim.metadata.name, namespace, grace_period_seconds=0
    )

    # The next attempt's pods are told where to resume: the path status.lastCheckpoint had
    # when the operator created them (read while they run: finished pods may be cleaned up).
    # Both pods: the operator creates them one request at a time, so a read between the two
    # sees one.
    def second_attempt() -> list[str] | None:
        pods = [p for p in job_pods(kube, namespace, name) if p.metadata.name.endswith("-a1")]
        if len(pods) < NODES:
            return None
        return [env_of(p).get("TORCHRUN_OPERATOR_RESUME_FROM", "") for p in pods]

    told = wait_for("the second attempt's pods", second_attempt, timeout=120)

    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, 300)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["attempt"] == 1 and len(done["status"]["restarts"]) == 1

    first, second = attempts(ckpt.read("steps.log") or "")
    # The first attempt started from scratch and got past the checkpoint seen above ...
    assert first[:2] == [0, 1] and first[-1] >= seen["step"], first
    # ... the second started from a checkpoint the first reported, at or after that one,
    # not from step 0, and trained on from the step after it to the end.
    resumed = second[0]
    assert seen["step"] <= resumed <= first[-1], (first, second)
    assert second[1:] == list(range(resumed + 1, STEPS + 1)), second
    # It was the operator that told it where.
    assert told == [f"/checkpoints/step-{resumed}.a0.pt"] * NODES, told
    # The last checkpoint of the run is the job's, the second attempt's own file.
    assert done["status"]["lastCheckpoint"]["step"] == STEPS
    assert done["status"]["lastCheckpoint"]["path"] == f"/checkpoints/step-{STEPS}.a1.pt"
