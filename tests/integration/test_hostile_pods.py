"""Nothing a pod says may hurt the operator (issue 24 §2; docs/security.md, docs/pod-contract.md).

Job "hostile": each pod has a sidecar that binds the launcher's status port (the trainer's
interpreters wait until it has: a sitecustomize; the test checks it did) and answers, in
turn, the sentinel step 2**64 - 1, a NaN rate, 64 KiB of nested brackets and 64 KiB of empty
objects; the training script writes the sentinel step to its progress file too, so the
launcher's final report carries it. Job "steady", alongside, trains
normally. The operator refuses every hostile answer and says so once per pod; "steady" keeps
a fresh live status (its step moves while "hostile" runs); "hostile" ends Succeeded from its
pods' exits, and the operator is the same process throughout.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import jobs
import pytest
from dtj import IMAGE, SMALL, apply, get_job, job_pods, wait_for, wait_phase
from hostile_bodies import STEP, hostile_server
from jobs import condition
from kubernetes import client
from test_rankmap import STATUS_PORT, script_job

pytestmark = pytest.mark.usefixtures("operator")

SENTINEL = STEP

# The training script: a few steps, each written to the progress file as the sentinel (an
# "unknown" step counter), then a file that tells the sidecar to stop.
TRAIN = f"""\
import json, os, time
import torch.distributed as dist

dist.init_process_group("gloo")
path = os.environ["TORCHRUN_OPERATOR_PROGRESS_FILE"]
for _ in range(160):
    time.sleep(0.5)
    dist.barrier()
    with open(path + ".tmp", "w") as fp:
        json.dump({{"step": {SENTINEL}}}, fp)
    os.replace(path + ".tmp", path)
dist.destroy_process_group()
open("/shared/done", "w").close()
"""

# The sidecar (the second container; the first is the trainer): binds the status port
# (retrying, in case the launcher got there first: then it never gets it, and the test says
# so) and answers hostile bodies in turn until the trainer is done.
SIDECAR = (
    hostile_server(0)
    + f"""
import socket, time

# Bind first, import the rest after: the launcher imports a good deal before it binds.
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
while True:
    try:
        listener.bind(("0.0.0.0", {STATUS_PORT}))
        break
    except OSError:
        time.sleep(0.01)
listener.listen(16)

import os

open("/shared/bound", "w").close()  # the trainer's sitecustomize waits for this

serve_hostile(listener)
print("sidecar serving", flush=True)
while not os.path.exists("/shared/done"):
    time.sleep(0.2)
time.sleep(1)
"""
)


# Every interpreter of the trainer imports this first (PYTHONPATH): the launcher's waits until
# the sidecar holds the status port. Containers start in order, the trainer first: a launcher
# that binds the port before the sidecar does leaves the sidecar nothing to answer on (what a
# kind run's time-out here looked like). Bounded: past it the launcher binds, and the test
# says the sidecars never answered.
WAIT_FOR_SIDECAR = """\
import os, time

deadline = time.monotonic() + 120
while not os.path.exists("/shared/bound") and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def hostile_job(name: str) -> list[dict[str, Any]]:
    docs = jobs.scripted(
        name,
        {"train.py": TRAIN, "sidecar.py": SIDECAR, "sitecustomize.py": WAIT_FOR_SIDECAR},
        ["python", "/workspace/train.py"],
        nodes=2,
        nproc=1,
        image=IMAGE,
        trainer={"resources": SMALL, "env": [{"name": "PYTHONPATH", "value": "/workspace"}]},
        pod={"terminationGracePeriodSeconds": 3},
        rendezvous={"joinTimeoutSeconds": 120},
        failurePolicy={"maxRestarts": 0},
        runPolicy={"cleanPodPolicy": "KeepAll"},
    )
    doc = docs[1]
    jobs.mount(doc, {"name": "shared", "emptyDir": {}}, "/shared")
    pod_spec = doc["spec"]["template"]["spec"]
    pod_spec["containers"].append(
        {
            "name": "answer",
            "image": IMAGE,
            "command": ["python", "-S", "/workspace/sidecar.py"],
            "resources": SMALL,
            "volumeMounts": [
                {"name": "script", "mountPath": "/workspace"},
                {"name": "shared", "mountPath": "/shared"},
            ],
        }
    )
    return docs


def answered_by_sidecar(ip: str) -> bool:
    """Whether the status port answers what the sidecar serves (never a launcher's answer)."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{STATUS_PORT}/status", timeout=2) as resp:
            body = resp.read()
    except (OSError, ValueError):
        return False
    return b'"rendezvousAt"' not in body and b'"time"' not in body


def test_hostile_pods_cannot_wedge_their_job_or_starve_another(
    kube: client.ApiClient, namespace: str
) -> None:
    # 3 minutes of steps: on a kind worker the hostile pods' sidecars answered only after
    # 200 steps (60 s) were done, and a finished job's step moves no more.
    steady = script_job("steady", 1, 1, STEPS="600", STEP_SLEEP="0.3")
    apply(kube, namespace, steady)
    apply(kube, namespace, hostile_job("hostile"))

    def sidecars_answering() -> list[Any] | None:
        pods = [p for p in job_pods(kube, namespace, "hostile") if p.status.pod_ip]
        if len(pods) < 2 or any(p.status.phase != "Running" for p in pods):
            return None
        return pods if all(answered_by_sidecar(p.status.pod_ip) for p in pods) else None

    wait_for("both sidecars answering on the status port", sidecars_answering, timeout=180)

    # While "hostile" runs, "steady"'s live step moves on.
    def steady_step() -> int | None:
        ranks = (get_job(kube, namespace, "steady").get("status") or {}).get("ranks") or []
        return ranks[0].get("step") if ranks else None

    first = wait_for("steady's live step", steady_step, timeout=120)
    hostile_phase = (get_job(kube, namespace, "hostile").get("status") or {}).get("phase")
    assert hostile_phase == "Running", hostile_phase

    def moved() -> int | None:
        phase = (get_job(kube, namespace, "steady").get("status") or {}).get("phase")
        assert phase == "Running", f"steady is {phase}: its step cannot move while hostile runs"
        step = steady_step()
        return step if step is not None and step > first else None

    wait_for("steady's live step to move on", moved, timeout=60)

    said = wait_for(
        "the PodInputRejected condition",
        lambda: condition(get_job(kube, namespace, "hostile"), "PodInputRejected"),
        timeout=60,
    )
    assert said["status"] == "True" and said["reason"] == "PodAnswerRejected", said

    done = wait_phase(kube, namespace, "hostile", {"Succeeded", "Failed"}, timeout=240)
    status = done["status"]
    assert status["phase"] == "Succeeded", status.get("failure")
    # The sentinel is nowhere in the status (the apiserver would refuse it past int64).
    assert all(r.get("step") != SENTINEL for r in status["ranks"]), status["ranks"]
    assert "progress" not in status or status["progress"].get("step") != SENTINEL

    events = client.CoreV1Api(kube).list_namespaced_event(
        namespace, field_selector="involvedObject.name=hostile"
    )
    rejected = [e for e in events.items if e.reason == "PodAnswerRejected"]
    # Said once per pod, however many answers and reports were refused.
    pods = {(e.message or "").split(":", 1)[0] for e in rejected}
    assert 1 <= len(pods) <= 2 and len(rejected) == len(pods), [e.message for e in rejected]
    assert all((e.count or 1) == 1 for e in rejected), [(e.message, e.count) for e in rejected]

    final = wait_phase(kube, namespace, "steady", {"Succeeded", "Failed"}, timeout=240)
    assert final["status"]["phase"] == "Succeeded", final["status"].get("failure")
