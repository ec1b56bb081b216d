"""Losing a node, shared by the tests of what the operator does then (test_restarts,
test_node_avoidance, tests/localkube/test_process_node).

On the local cluster a node is lost by pausing its heartbeats (localkube's process node:
`<node state>/<node>/pause-heartbeat`, cluster/localkube/node/nodes.py): the node controller
marks it NotReady, taints it, and the taint evicts its pods, which its kubelet, still at work,
then stops. On kind the node's container is frozen (`docker pause`): the kubelet, the runtime
and the pods stop together. The node goes NotReady and is tainted as above; once its evicted
pods are marked for deletion the container is thawed, so its kubelet stops them as the
process node's does (a partition that heals). A `dead` node stays frozen for the whole block:
nothing of it reaches the apiserver again. The pods tolerate the taint only briefly
(FAST_EVICTION), so a test waits seconds for the eviction, not the default 300.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from localkube.testing import wait_for

# How long a frozen kind node waits for its pods' eviction before it is thawed anyway: the
# node controller's grace (50 s by default) plus the pods' 2 s, with room.
EVICTION_TIMEOUT = 180.0
# Evicted 2 s after the node's not-ready or unreachable taint, not the default 300 s.
FAST_EVICTION_SECONDS = 2
FAST_EVICTION = [
    {
        "key": f"node.kubernetes.io/{k}",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": FAST_EVICTION_SECONDS,
    }
    for k in ("not-ready", "unreachable")
]


def node_containers(kube: client.ApiClient) -> dict[str, str]:
    """Node name -> the Docker container on this host that is the node, when every node of
    the cluster is one (kind's: providerID kind://docker/<cluster>/<node>); else empty."""
    nodes: Any = client.CoreV1Api(kube).list_node()
    found: dict[str, str] = {}
    for n in nodes.items:
        provider = n.spec.provider_id or ""
        if not provider.startswith("kind://docker/"):
            return {}
        found[n.metadata.name] = provider.rsplit("/", 1)[1]
    running = (
        subprocess.run(
            ["docker", "ps", "--format", "{{.Names}}"], capture_output=True, text=True, check=False
        ).stdout.split()
        if shutil.which("docker")
        else []
    )
    return found if found and set(found.values()) <= set(running) else {}


def spread(job: str) -> dict[str, Any]:
    """A pod affinity: one pod of `job` per node while both nodes are up (preferred, so the
    next gang still fits on the one node left)."""
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"torchrun.dev/job-name": job}},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        }
    }


def why_together(kube: client.ApiClient, namespace: str, job: str) -> str:
    """For a test that found a job's pods on one node although spread() prefers two: the
    scheduler's view of every node (schedulable, Ready, taints, the pods on it that are not
    finished), so that the failure says what filled or fenced the other node."""
    core = client.CoreV1Api(kube)
    lines = []
    nodes: Any = core.list_node()
    for n in nodes.items:
        ready = next((c.status for c in n.status.conditions or [] if c.type == "Ready"), "?")
        taints = [f"{t.key}:{t.effect}" for t in n.spec.taints or []]
        pods: Any = core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={n.metadata.name}"
        )
        live = [
            f"{p.metadata.namespace}/{p.metadata.name}"
            for p in pods.items
            if p.status.phase not in ("Succeeded", "Failed")
        ]
        lines.append(
            f"{n.metadata.name}: Ready={ready} unschedulable={bool(n.spec.unschedulable)}"
            f" taints={taints} allocatable={n.status.allocatable}"
            f" {len(live)} pods: {', '.join(live[:20])}"
        )
    events: Any = core.list_namespaced_event(namespace)
    said = [
        f"{e.involved_object.name}: {e.reason}: {e.message}"
        for e in events.items
        if e.involved_object.name
        and e.involved_object.name.startswith(job)
        and e.reason in ("Scheduled", "FailedScheduling")
    ]
    return "\n".join(["the nodes:", *lines, "the scheduler said:", *said])


def _evicted(core: client.CoreV1Api, node: str) -> bool:
    """Every pod on `node` that tolerates its loss for FAST_EVICTION's seconds at most (the
    tests' pods, not the 300 s every other pod gets by default) is marked for deletion."""
    pods: Any = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
    fast = [
        p
        for p in pods.items
        if any(
            t.key == "node.kubernetes.io/unreachable"
            and t.toleration_seconds is not None
            and t.toleration_seconds <= FAST_EVICTION_SECONDS
            for t in p.spec.tolerations or []
        )
    ]
    return all(p.metadata.deletion_timestamp for p in fast)


# runc freezes a container's cgroup and gives up ("unable to freeze") when a busy node's
# processes do not all stop within its own short wait; it thaws what it froze, so a retry is
# safe (seen once on a kind worker under load, 2026-11-28).
PAUSE_TRIES = 5


def _docker(*args: str) -> None:
    out = subprocess.run(["docker", *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"docker {' '.join(args)}: {out.stderr.strip()}")


def _pause(container: str) -> None:
    for attempt in range(PAUSE_TRIES):
        try:
            _docker("pause", container)
            return
        except RuntimeError:
            if attempt == PAUSE_TRIES - 1:
                raise
            time.sleep(1)


@contextmanager
def _paused(node_state: Path, node: str, dead: bool) -> Iterator[None]:
    """localkube: the process node's heartbeats paused (or, `dead`, its kubelet gone) for
    the block."""
    marker = node_state / node / ("dead" if dead else "pause-heartbeat")
    marker.touch()
    try:
        yield
    finally:
        marker.unlink()


@contextmanager
def _frozen(kube: client.ApiClient, node: str, dead: bool) -> Iterator[None]:
    """kind: the node's container frozen for the block, or (not `dead`) until its pods that
    tolerate its loss briefly are marked for deletion."""
    container = node_containers(kube).get(node)
    assert container, f"{node} is neither a process node nor a kind node of this host"
    core = client.CoreV1Api(kube)
    _pause(container)
    thawed = threading.Event()
    done = threading.Event()

    def thaw_after_eviction() -> None:
        deadline = time.monotonic() + EVICTION_TIMEOUT
        while not done.wait(1) and time.monotonic() < deadline:
            if _evicted(core, node):
                break
        if not done.is_set():
            _docker("unpause", container)
            thawed.set()

    thawer = None if dead else threading.Thread(target=thaw_after_eviction, daemon=True)
    if thawer is not None:
        thawer.start()
    try:
        yield
    finally:
        done.set()
        if thawer is not None:
            thawer.join()
        if not thawed.is_set():
            _docker("unpause", container)


@contextmanager
def node_lost(
    cluster: Any, kube: client.ApiClient, node: str, ready_timeout: float, dead: bool = False
) -> Iterator[None]:
    """Loses `node` for the block (the module's docstring says how); afterwards waits (up to
    `ready_timeout` s) until the node is Ready with no node.kubernetes.io/ taint left, so the
    next test finds both nodes usable. `dead`: its kubelet is gone altogether (localkube's
    `<node>/dead`; kind's container stays frozen): nothing of its pods reaches the apiserver,
    so a pod deleted there stays Terminating until someone forces it."""
    core = client.CoreV1Api(kube)
    layout = getattr(cluster, "layout", None)
    lost = _paused(Path(layout.node_state), node, dead) if layout else _frozen(kube, node, dead)
    try:
        with lost:
            yield
    finally:
        wait_for(
            f"{node} Ready again",
            lambda: _healthy(core.read_node(node)),
            timeout=ready_timeout,
            interval=1,
        )


# Every worker usable again after what an earlier test left: a node lost and back (NotReady
# for up to the node monitor's grace, 40 s by default, then its taints lifted), an apiserver
# restarted, or pods still going with their namespace (on kind, an exclusive gang's pod whose
# required anti-affinity closed its rack to every other pod outlived its test by minutes).
USABLE_TIMEOUT = 180.0


def workers_usable(kube: client.ApiClient) -> None:
    """Waits (up to USABLE_TIMEOUT) until every node meant for pods (no taint of its own
    outside node.kubernetes.io/, such as the control plane's) is Ready, schedulable and
    without a node.kubernetes.io/ taint, and no pod on them is being deleted or belongs to a
    namespace being deleted: a test that spreads a job over two nodes must not find one of
    them still healing from, or held by, an earlier test."""
    core = client.CoreV1Api(kube)

    def unusable() -> list[str]:
        listed: Any = core.list_node()
        workers = {n.metadata.name: n for n in listed.items if _meant_for_pods(n)}
        out = [name for name, n in workers.items() if n.spec.unschedulable or not _healthy(n)]
        spaces: Any = core.list_namespace()
        going = {ns.metadata.name for ns in spaces.items if ns.status.phase == "Terminating"}
        pods: Any = core.list_pod_for_all_namespaces()
        out += [
            f"{p.metadata.namespace}/{p.metadata.name} (going, on {p.spec.node_name})"
            for p in pods.items
            if p.spec.node_name in workers
            and (p.metadata.deletion_timestamp or p.metadata.namespace in going)
        ]
        return out

    try:
        wait_for("every worker usable", lambda: not unusable(), USABLE_TIMEOUT, 1)
    except TimeoutError as e:
        raise TimeoutError(f"{e}: still {unusable()}") from None


# The node controller's and kubelet's own taints (not-ready, unreachable, ...): the node's
# state, not a choice of what may run there.
STATE_TAINTS = "node.kubernetes.io/"


def _meant_for_pods(n: Any) -> bool:
    """No taint but the node's state (the control plane's own taint keeps pods off it)."""
    return all(t.key.startswith(STATE_TAINTS) for t in n.spec.taints or [])


def _healthy(n: Any) -> bool:
    """Ready, with no taint of the node's state left."""
    ready = next((c.status for c in n.status.conditions or [] if c.type == "Ready"), None)
    return ready == "True" and not any(t.key.startswith(STATE_TAINTS) for t in n.spec.taints or [])
