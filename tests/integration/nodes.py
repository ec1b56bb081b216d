"""Losing a node of the local cluster, shared by the tests of what the operator does then
(test_restarts, test_node_avoidance, test_process_node).

A node is lost by pausing its heartbeats (localkube's process node: `<node state>/<node>/
pause-heartbeat`, cluster/localkube/node/nodes.py): the node controller marks it NotReady,
taints it, and the taint evicts its pods. The pods tolerate that taint only briefly
(FAST_EVICTION), so a test waits seconds for the eviction, not the default 300.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from localkube.testing import wait_for

# Evicted 2 s after the node's not-ready or unreachable taint, not the default 300 s.
FAST_EVICTION = [
    {
        "key": f"node.kubernetes.io/{k}",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 2,
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


@contextmanager
def node_lost(
    cluster: Any, kube: client.ApiClient, node: str, ready_timeout: float, dead: bool = False
) -> Iterator[None]:
    """Pauses `node`'s heartbeats for the block; afterwards resumes them and waits (up to
    `ready_timeout` s) until the node is Ready with no node.kubernetes.io/ taint left, so the
    next test finds both nodes usable. `dead`: its kubelet is gone altogether (`<node>/dead`):
    nothing of its pods reaches the apiserver either, so a pod deleted there stays
    Terminating until someone forces it."""
    marker = "dead" if dead else "pause-heartbeat"
    pause = Path(cluster.layout.node_state) / node / marker
    core = client.CoreV1Api(kube)
    pause.touch()
    try:
        yield
    finally:
        pause.unlink()

        def healthy() -> bool:
            n: Any = core.read_node(node)
            ready = next(c.status for c in n.status.conditions if c.type == "Ready")
            taints = [t.key for t in n.spec.taints or []]
            return ready == "True" and not any(k.startswith("node.kubernetes.io/") for k in taints)

        wait_for(f"{node} Ready again", healthy, timeout=ready_timeout, interval=1)
