"""The process node (localkube.node) against the real control plane: pods run as processes in
their own network namespaces, report their status, resolve each other through CoreDNS, and
go away when deleted, garbage collected or evicted from a lost node."""

from __future__ import annotations

import base64
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pace
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube.testing import wait_for
from nodes import FAST_EVICTION, node_lost

# The typed client wants model objects; these tests pass plain dicts, which it accepts.
Core = Any

pytestmark = pytest.mark.slow


def pod(
    name: str, script: str, *, restart: str = "Never", shell: str = "sh", **spec: Any
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "python:3.11",
        "command": [shell, "-c", script],
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **spec.pop("meta", {})},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            **spec,
        },
    }


def create(core: Core, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    return core.api_client.sanitize_for_serialization(core.create_namespaced_pod(ns, body))


def read(core: Core, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, ns))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def wait_phase(
    core: Core, ns: str, name: str, phases: tuple[str, ...], timeout: float = 60
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        p = read(core, ns, name)
        return p if p and p.get("status", {}).get("phase") in phases else None

    try:
        return wait_for(f"{name} in {phases}", check, timeout=timeout, interval=0.3)
    except TimeoutError:
        p = read(core, ns, name)
        raise AssertionError(f"{name}: {p and p.get('status')}") from None


def log_of(cluster: Any, ns: str, name: str, container: str = "main") -> str:
    path = Path(cluster.layout.node_state) / "logs" / ns / name / f"{container}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def terminated(p: dict[str, Any], container: str = "main") -> dict[str, Any]:
    cs = next(c for c in p["status"]["containerStatuses"] if c["name"] == container)
    return dict(cs["state"]["terminated"])


@pytest.fixture
def core(kube: client.ApiClient) -> Core:
    return client.CoreV1Api(kube)


def test_downward_api_volumes_and_termination_message(
    cluster: Any, core: Core, namespace: str
) -> None:
    ns = namespace
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "cfg"}, "data": {"greeting": "hello", "mode": "fast"}}
    )
    core.create_namespaced_secret(
        ns,
        {"metadata": {"name": "sec"}, "data": {"password": base64.b64encode(b"s3cret").decode()}},
    )
    script = "\n".join(
        [
            "import os",
            "e = os.environ",
            "print('ENV', e['POD_NAME'], e['POD_NS'], e['POD_IP'], e['NODE'], e['LBL'], e['CPU'],"
            " e['GREETING'], e['PASSWORD'], e['CFG_mode'], e['MSG'])",
            "print('FILES', open('/etc/cfg/greeting').read(), open('/etc/sec/password').read(),"
            " open('/etc/info/name').read(), open('/etc/info/labels').read())",
            "tok = open('/var/run/secrets/kubernetes.io/serviceaccount/token').read()",
            "print('TOKEN', tok.count('.'), 'CA', 'BEGIN CERT' in open("
            "'/var/run/secrets/kubernetes.io/serviceaccount/ca.crt').read())",
            "print('CWD', os.getcwd())",
            "open('/dev/termination-log', 'w').write('all good')",
        ]
    )
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "LBL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {
            "name": "CPU",
            "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}},
        },
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "password"}}},
        {"name": "MSG", "value": "ip=$(POD_IP)"},
    ]
    body = pod(
        "echo",
        script,
        shell="python",
        meta={"labels": {"app": "demo"}},
        container={
            "command": ["python", "-c", script],
            "env": env,
            "workingDir": "/tmp",
            "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "cfg"}}],
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}},
            "volumeMounts": [
                {"name": "cfg", "mountPath": "/etc/cfg"},
                {"name": "sec", "mountPath": "/etc/sec", "readOnly": True},
                {"name": "info", "mountPath": "/etc/info"},
            ],
        },
        volumes=[
            {"name": "cfg", "configMap": {"name": "cfg"}},
            {"name": "sec", "secret": {"secretName": "sec"}},
            {
                "name": "info",
                "downwardAPI": {
                    "items": [
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    ]
                },
            },
        ],
    )
    body["spec"]["containers"][0]["command"] = ["python", "-c", script]
    create(core, ns, body)
    fail = pod(
        "fail",
        "echo about to fail >&2; exit 3",
        container={"terminationMessagePolicy": "FallbackToLogsOnError"},
    )
    create(core, ns, fail)

    p = wait_phase(core, ns, "echo", ("Succeeded", "Failed"))
    out = log_of(cluster, ns, "echo")
    assert p["status"]["phase"] == "Succeeded", out
    t = terminated(p)
    assert (t["exitCode"], t["reason"], t["message"]) == (0, "Completed", "all good")
    ip = p["status"]["podIP"]
    assert ip.startswith("10.") and p["status"]["podIPs"] == [{"ip": ip}]
    node = p["spec"]["nodeName"]
    assert f"ENV echo {ns} {ip} {node} demo 500 hello s3cret fast ip={ip}" in out
    assert 'FILES hello s3cret echo app="demo"' in out
    assert "TOKEN 2 CA True" in out and "CWD /tmp" in out
    conds = {c["type"]: c["status"] for c in p["status"]["conditions"]}
    assert conds["PodScheduled"] == "True" and conds["Initialized"] == "True"
    assert conds["Ready"] == "False"

    f = wait_phase(core, ns, "fail", ("Succeeded", "Failed"))
    assert f["status"]["phase"] == "Failed"
    t = terminated(f)
    assert (t["exitCode"], t["reason"]) == (3, "Error")
    assert "about to fail" in t["message"]


def test_headless_service_dns_between_pods(cluster: Any, core: Core, namespace: str) -> None:
    ns = namespace
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "peers"},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"app": "peers"},
                "ports": [{"name": "talk", "port": 7000}],
            },
        },
    )
    server = "\n".join(
        [
            "import socket",
            "s = socket.create_server(('0.0.0.0', 7000))",
            "c, _ = s.accept()",
            "print('GOT', c.recv(100).decode(), flush=True)",
            "c.sendall(b'pong')",
        ]
    )
    fqdn = f"b.peers.{ns}.svc.cluster.local"
    clnt = "\n".join(
        [
            "import socket, time",
            "for i in range(200):",
            "    try:",
            f"        addr = socket.gethostbyname('{fqdn}')",
            "        c = socket.create_connection((addr, 7000), timeout=2)",
            "        break",
            "    except OSError:",
            "        time.sleep(0.25)",
            "print('RESOLVED', addr, socket.gethostname(), flush=True)",
            "c.sendall(('ping from ' + socket.gethostname()).encode())",
            "print('REPLY', c.recv(100).decode(), flush=True)",
        ]
    )
    for name, script in (("b", server), ("a", clnt)):
        body = pod(
            name,
            "",
            meta={"labels": {"app": "peers"}},
            hostname=name,
            subdomain="peers",
            container={"command": ["python", "-c", script]},
        )
        create(core, ns, body)
    a = wait_phase(core, ns, "a", ("Succeeded", "Failed"))
    b = wait_phase(core, ns, "b", ("Succeeded", "Failed"))
    assert (a["status"]["phase"], b["status"]["phase"]) == ("Succeeded", "Succeeded"), (
        log_of(cluster, ns, "a"),
        log_of(cluster, ns, "b"),
    )
    assert f"RESOLVED {b['status']['podIP']} a" in log_of(cluster, ns, "a")
    assert "REPLY pong" in log_of(cluster, ns, "a")
    assert "GOT ping from a" in log_of(cluster, ns, "b")


# torchrun runs its workers unbuffered (python -u), where print() writes the text and the
# newline separately: two ranks of one pod printing at once can share a line. One write each.
ALLREDUCE = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
sys.stdout.write(f"RANK {dist.get_rank()} WORLD {dist.get_world_size()} SUM {t.item():g}\\n")
dist.destroy_process_group()
"""


def test_torchrun_across_two_pods(cluster: Any, core: Core, namespace: str) -> None:
    ns = namespace
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "script"}, "data": {"allreduce.py": ALLREDUCE}}
    )
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "tr"},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"app": "tr"},
                "ports": [{"name": "c10d", "port": 29400}],
            },
        },
    )
    for i in range(2):
        args = [
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "tr-0.tr:29400",
            "--rdzv-id",
            "test",
            "--rdzv-conf",
            # Both torchruns import torch before they join: one may be late by that much.
            f"is_host={1 if i == 0 else 0},join_timeout={pace.torch_processes(2):.0f}",
            "--local-addr",
            "$(POD_IP)",
            "/opt/script/allreduce.py",
        ]
        body = pod(
            f"tr-{i}",
            "",
            meta={"labels": {"app": "tr"}},
            hostname=f"tr-{i}",
            subdomain="tr",
            container={
                "command": ["python"],
                "args": args,
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                ],
                "volumeMounts": [
                    {"name": "script", "mountPath": "/opt/script"},
                    {"name": "shm", "mountPath": "/dev/shm"},
                ],
            },
            volumes=[
                {"name": "script", "configMap": {"name": "script"}},
                {"name": "shm", "emptyDir": {"medium": "Memory"}},
            ],
        )
        create(core, ns, body)
    budget = pace.launchers(2, 2)  # two torchruns of two workers each
    results = [
        wait_phase(core, ns, f"tr-{i}", ("Succeeded", "Failed"), timeout=budget) for i in range(2)
    ]
    logs = [log_of(cluster, ns, f"tr-{i}") for i in range(2)]
    assert [r["status"]["phase"] for r in results] == ["Succeeded", "Succeeded"], logs
    lines = [ln for lg in logs for ln in lg.splitlines() if "WORLD 4 SUM" in ln]
    assert len(lines) == 4 and all(ln.rstrip().endswith("SUM 10") for ln in lines), logs


def _host_pids_with(marker: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmd:
            pids.append(int(d))
    return pids


def _gone(core: Core, ns: str, name: str) -> Callable[[], bool]:
    return lambda: read(core, ns, name) is None


def test_delete_kills_process_tree_and_gc_removes_owned_pod(core: Core, namespace: str) -> None:
    ns = namespace
    marker = str(random.randrange(10**6, 10**7))
    # sh as PID 1 ignores SIGTERM (as in any container): the grace period then ends in SIGKILL.
    create(core, ns, pod("tree", f"sleep {marker} & sleep {marker} & wait"))
    wait_phase(core, ns, "tree", ("Running",))
    wait_for("both sleeps", lambda: len(_host_pids_with(marker)) == 2, timeout=10)
    core.delete_namespaced_pod("tree", ns)
    wait_for("pod tree deleted", _gone(core, ns, "tree"), timeout=30)
    assert _host_pids_with(marker) == []

    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    owned = pod(
        "owned",
        "sleep 1000",
        meta={
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": cm.metadata.uid}
            ]
        },
    )
    create(core, ns, owned)
    wait_phase(core, ns, "owned", ("Running",))
    core.delete_namespaced_config_map("owner", ns)
    wait_for("owned pod garbage collected", _gone(core, ns, "owned"), timeout=40)


def test_readiness_probe_and_restart_on_failure(cluster: Any, core: Core, namespace: str) -> None:
    ns = namespace
    probe = {
        "exec": {"command": ["cat", "/state/ready"]},
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    create(
        core,
        ns,
        pod(
            "probed",
            "sleep 2; touch /state/ready; sleep 4; rm /state/ready; sleep 1000",
            container={
                "readinessProbe": probe,
                "volumeMounts": [{"name": "s", "mountPath": "/state"}],
            },
            volumes=[{"name": "s", "emptyDir": {}}],
        ),
    )
    create(core, ns, pod("crashy", "echo crashing; exit 1", restart="OnFailure"))

    def ready() -> str | None:
        p = read(core, ns, "probed")
        conds = {c["type"]: c["status"] for c in (p or {}).get("status", {}).get("conditions", [])}
        return conds.get("Ready")

    seen: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and seen[-3:] != ["False", "True", "False"]:
        r = ready()
        if r and (not seen or seen[-1] != r):
            seen.append(r)
        time.sleep(0.3)
    assert seen[-3:] == ["False", "True", "False"]

    def restarts() -> int:
        p = read(core, ns, "crashy")
        cs = (p or {}).get("status", {}).get("containerStatuses") or [{}]
        return int(cs[0].get("restartCount", 0))

    wait_for("two restarts", lambda: restarts() >= 2, timeout=50)
    p = read(core, ns, "crashy")
    assert p is not None
    cs = p["status"]["containerStatuses"][0]
    assert p["status"]["phase"] == "Running"
    assert cs["lastState"]["terminated"]["exitCode"] == 1
    # The log is read while the container may be starting again: its next run writes it anew.
    wait_for("crashy's log", lambda: "crashing" in log_of(cluster, ns, "crashy"), timeout=20)


def test_lost_node_goes_not_ready_and_its_pods_are_evicted(
    cluster: Any, kube: client.ApiClient, core: Core, namespace: str
) -> None:
    ns = namespace
    node = "node-1"
    create(
        core,
        ns,
        pod(
            "victim",
            "sleep 1000",
            nodeSelector={"kubernetes.io/hostname": node},
            tolerations=FAST_EVICTION,
        ),
    )
    wait_phase(core, ns, "victim", ("Running",))

    def node_ready() -> str:
        n = core.read_node(node)
        return next(c.status for c in n.status.conditions if c.type == "Ready")

    # node_lost waits afterwards (45 s at most) until the node is Ready with no taint left
    with node_lost(cluster, kube, node, ready_timeout=45):
        wait_for("node NotReady", lambda: node_ready() != "True", timeout=45, interval=1)
        wait_for("victim evicted", _gone(core, ns, "victim"), timeout=30)
