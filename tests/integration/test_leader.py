"""Lease leader election: two operator replicas, one acts; the standby takes over."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pace
import pytest
from dtj import (
    REPO,
    OperatorProcess,
    apply,
    create_job,
    load_docs,
    quick_job,
    wait_for,
    wait_phase,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from torchrun_operator.kube.leader import LEASE_DURATION_SECONDS, RENEW_DEADLINE_SECONDS

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
        lease: Any = client.CoordinationV1Api(kube).read_namespaced_lease(LEASE, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    name: str | None = lease.spec.holder_identity
    return name


def first_seen(logs: dict[str, tuple[OperatorProcess, str]], timeout: float) -> dict[str, float]:
    """When each (replica, line) of `logs` first showed up in the replica's log, polled every
    0.2 s until all have or `timeout` passes."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(logs) and time.monotonic() < deadline:
        for what, (op, line) in logs.items():
            if what not in seen and line in op.log():
                seen[what] = time.monotonic()
        time.sleep(0.2)
    return seen


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
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
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
        timeout=LEASE_DURATION_SECONDS + 30,
    )
    assert standby.proc is not None and identity_pid(second) == standby.proc.pid
    wait_for("the standby to lead", lambda: "became leader" in standby.log(), timeout=15)

    for d in docs:
        d["metadata"]["name"] = d["metadata"]["name"].replace("hello-dist", "after-failover")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    after = next(d for d in docs if d["kind"] == "DistributedTrainingJob")
    after["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] = cm["metadata"]["name"]
    apply(kube, namespace, docs)
    done = wait_phase(kube, namespace, "after-failover", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert len(done["status"]["ranks"]) == 2
    assert pod_creates(standby) == 2


def test_a_leader_that_cannot_renew_stops_before_the_standby_takes_over(
    operator: OperatorProcess,
    cluster: Any,
    kube: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The leader's Lease renewals fail from the 3rd on (fault injection, 503): it must stop
    acting within its renew deadline, before the standby's lease duration runs out."""
    operator.kill()  # it would act on every job too
    fault_log = tmp_path / "faults.log"
    faults = tmp_path / "faults.json"
    renewals = f"/namespaces/{namespace}/leases/{LEASE}$"
    rule = {"method": "PUT", "path": renewals, "nth": 3, "times": "all", "action": "status"}
    faults.write_text(json.dumps({"log": str(fault_log), "rules": [{**rule, "status": 503}]}))
    ops = [
        OperatorProcess(
            Path(cluster.kubeconfig),
            tmp_path / name,
            extra=["--leader-election-namespace", namespace],
        )
        for name in ("cut-off", "standby")
    ]
    cut_off, standby = ops
    try:
        for op in ops:
            op.log_dir.mkdir()
        with monkeypatch.context() as m:  # only the first replica gets the faults
            m.setenv("TORCHRUN_OPERATOR_FAULTS", str(faults))
            cut_off.start()
        assert cut_off.proc is not None
        first = wait_for("a lease holder", lambda: holder(kube, namespace), timeout=60)
        assert identity_pid(first) == cut_off.proc.pid
        standby.start()
        seen = first_seen(
            {
                "stopped": (cut_off, "lost leadership"),
                "took over": (standby, "became leader"),
            },
            timeout=LEASE_DURATION_SECONDS + 90,
        )
        assert set(seen) == {"stopped", "took over"}, seen
        # Stopped at most renew deadline (40 s) after its last good renewal; the standby
        # waited the lease duration (60 s) from when it saw that renewal: 20 s apart or more.
        assert seen["took over"] - seen["stopped"] > 2.0, seen
        assert "could not renew" in cut_off.log()
        assert "fault injection is ON" in cut_off.log()
        assert "fault injection is ON" not in standby.log()
        assert standby.proc is not None
        assert identity_pid(holder(kube, namespace) or "-0") == standby.proc.pid
        injected = [json.loads(line) for line in fault_log.read_text().splitlines()]
        assert injected and all(f["method"] == "PUT" for f in injected)
        assert {f["pid"] for f in injected} == {cut_off.proc.pid}
        assert "became leader" not in cut_off.log().split("lost leadership", 1)[1]
    finally:
        for op in ops:
            op.kill()
        operator.start()
    for op in ops:
        assert "Traceback" not in op.log(), op.log()[-4000:]


def test_a_deposed_leader_sends_no_write_after_its_fence_and_the_new_one_finishes_the_job(
    operator: OperatorProcess,
    cluster: Any,
    kube: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The leader's Lease renewals fail from the 3rd on (503) while it creates a 6-pod job's
    pods, four of which are held up (a renew deadline and 10 s each, before they are sent: a
    slow apiserver) past its fence. Each write the leader does send is logged once answered
    (fault rule "pass"). It must send none after its fence, also not the four creates it had
    in flight; the new leader creates them, and the job succeeds."""
    operator.kill()  # it would act on every job too
    fault_log = tmp_path / "faults.log"
    faults = tmp_path / "faults.json"
    lease = f"/namespaces/{namespace}/leases/{LEASE}$"
    rules: list[dict[str, Any]] = [
        # 0: pod creates from the 3rd on wait past the term before they go out.
        {
            "method": "POST",
            "path": "/pods$",
            "nth": 3,
            "times": "all",
            "delay": RENEW_DEADLINE_SECONDS + 10.0,
        },
        # 1: renewals fail from the 3rd on.
        {"method": "PUT", "path": lease, "nth": 3, "times": "all", "action": "status"},
        # 2: every other write that goes out (not the Lease's), logged when answered.
        {"method": "writes", "path": "^(?!.*/leases/)", "times": "all"},
    ]
    rules[1]["status"] = 503
    config = {"log": str(fault_log), "rules": [{"action": "pass", **r} for r in rules]}
    faults.write_text(json.dumps(config))
    ops = [
        OperatorProcess(
            Path(cluster.kubeconfig),
            tmp_path / name,
            extra=["--leader-election-namespace", namespace],
        )
        for name in ("deposed", "successor")
    ]
    deposed, successor = ops
    try:
        for op in ops:
            op.log_dir.mkdir()
        with monkeypatch.context() as m:  # only the first replica gets the faults
            m.setenv("TORCHRUN_OPERATOR_FAULTS", str(faults))
            deposed.start()
        assert deposed.proc is not None
        first = wait_for("a lease holder", lambda: holder(kube, namespace), timeout=60)
        assert identity_pid(first) == deposed.proc.pid
        # The first two pods wait for the other four until the successor creates them (a
        # lease duration or more), then for those to start on a loaded machine: more than the
        # 90 s default.
        rendezvous = {"joinTimeoutSeconds": 300}
        job = create_job(kube, namespace, quick_job("fenced", nodes=6, rendezvous=rendezvous))
        name = job["metadata"]["name"]
        successor.start()
        assert successor.proc is not None
        wait_for(
            "the successor to lead",
            lambda: "became leader" in successor.log() and "lost leadership" in deposed.log(),
            timeout=LEASE_DURATION_SECONDS + 90,
        )
        # Six pods' launchers and workers start (pace); the job does nothing more.
        budget = pace.attempts(pods=6)
        done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=budget)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        assert sorted(r["pod"] for r in done["status"]["ranks"]) == [
            f"{name}-{i}" for i in range(6)
        ]
        assert identity_pid(holder(kube, namespace) or "-0") == successor.proc.pid

        logged = [json.loads(line) for line in fault_log.read_text().splitlines()]
        assert {f["pid"] for f in logged} == {deposed.proc.pid}
        renewals_failed = [f["time"] for f in logged if f["rule"] == 1]
        assert renewals_failed, logged
        # Its last good renewal went out before the first failed one: its term, counted from
        # that renewal, ended RENEW_DEADLINE_SECONDS after it at the latest.
        fence = min(renewals_failed) + RENEW_DEADLINE_SECONDS
        sent = [f for f in logged if f["action"] == "pass"]
        creates = [f for f in sent if f["method"] == "POST" and f["path"].endswith("/pods")]
        assert len(creates) == 2, sent  # the first two; the four held up never went out
        late = [f for f in sent if f["time"] >= fence]
        assert late == [], (fence, late)
        assert re.search(r"POST \S+/pods not sent: this replica is not the leader", deposed.log())
        # The successor created the four: with the deposed leader's two, each pod once.
        assert pod_creates(successor) == 4
        assert "became leader" not in deposed.log().split("lost leadership", 1)[1]
    finally:
        for op in ops:
            op.kill()
        operator.start()
    for op in ops:
        assert "Traceback" not in op.log(), op.log()[-4000:]
