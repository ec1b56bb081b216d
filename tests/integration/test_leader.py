"""Lease leader election: two operator replicas, one acts; the standby takes over."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dtj import REPO, OperatorProcess, apply, load_docs, wait_for, wait_phase
from kubernetes import client
from kubernetes.client.exceptions import ApiException

LEASE = "torchrun-operator"
HELLO = REPO / "examples" / "configmap-script.yaml"  # 2 pods x 1 process, one all-reduce

_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)$", re.M)


def pod_creates(op: OperatorProcess) -> float | None:
    """Pods this replica created, from its own /metrics (the API-request counter); None
    while it does not serve them yet."""
    try:
        url = f"http://127.0.0.1:{op.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    total = 0.0
    for metric, labels, value in _SAMPLE.findall(text):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if (
            "api_request" in metric
            and metric.endswith("_total")
            and found.get("verb") == "create"
            and found.get("resource") == "pod"
            and found.get("code", "").startswith("2")
        ):
            total += float(value)
    return total


def holder(kube: client.ApiClient, ns: str) -> str | None:
    try:
        lease = client.CoordinationV1Api(kube).read_namespaced_lease(LEASE, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    name: str | None = lease.spec.holder_identity
    return name


def identity_pid(identity: str) -> int:
    return int(identity.rsplit("-", 1)[1])  # "<hostname>-<pid>" (handlers.py)


@pytest.fixture
def replicas(
    operator: OperatorProcess, cluster: Any, namespace: str, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    """Two replicas electing a leader in `namespace`. The session's operator (no election)
    is stopped meanwhile: it would act on every job too."""
    operator.kill()
    ops = [
        OperatorProcess(
            Path(cluster.kubeconfig),
            tmp_path / f"replica-{i}",
            extra=["--leader-election-namespace", namespace],
        )
        for i in (0, 1)
    ]
    try:
        for op in ops:
            op.log_dir.mkdir()
            op.start()
        yield ops
    finally:
        for op in ops:
            op.kill()
        operator.start()
    for op in ops:
        assert "Traceback" not in op.log(), op.log()[-4000:]


def test_one_leader_acts_and_the_standby_takes_over_when_it_dies(
    kube: client.ApiClient, namespace: str, replicas: list[OperatorProcess]
) -> None:
    by_pid = {op.proc.pid: op for op in replicas if op.proc}
    first = wait_for("a lease holder", lambda: holder(kube, namespace), timeout=60)
    leader = by_pid[identity_pid(first)]
    standby = next(op for op in replicas if op is not leader)
    wait_for("metrics served", lambda: pod_creates(standby) == 0, timeout=30)

    docs = load_docs(HELLO)
    job = apply(kube, namespace, docs)
    name = job["metadata"]["name"]
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=180)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert holder(kube, namespace) == first
    assert [r["pod"] for r in done["status"]["ranks"]] == [f"{name}-0", f"{name}-1"]
    assert pod_creates(leader) == 2  # exactly the job's pods, and none by the standby
    assert pod_creates(standby) == 0
    assert "became leader" in leader.log() and "became leader" not in standby.log()

    leader.kill()  # SIGKILL: no release of the lease; the standby waits for it to expire
    second = wait_for(
        "the standby to take the lease over",
        lambda: (h := holder(kube, namespace)) not in (None, first) and h,
        timeout=45,
    )
    assert standby.proc is not None and identity_pid(second) == standby.proc.pid
    wait_for("the standby to lead", lambda: "became leader" in standby.log(), timeout=15)

    for d in docs:
        d["metadata"]["name"] = d["metadata"]["name"].replace("hello-dist", "after-failover")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    after = next(d for d in docs if d["kind"] == "DistributedTrainingJob")
    after["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] = cm["metadata"]["name"]
    apply(kube, namespace, docs)
    done = wait_phase(kube, namespace, "after-failover", {"Succeeded", "Failed"}, timeout=180)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert len(done["status"]["ranks"]) == 2
    assert pod_creates(standby) == 2
