"""Node registration, status heartbeat and the Lease in `kube-node-lease`.

A node may keep a clock of its own (`clockSkewSeconds` in its --nodes-json entry, e.g. 3600
for an hour ahead): every time it writes (pod start and container times, condition
transitions, its heartbeats and Lease renewals) is this host's clock plus the skew, as a
kubelet on a machine whose clock is off writes them. The processes in its pods still read this
host's clock (the launcher's own report times are not skewed).

A test pauses a node's heartbeats by creating `STATE_DIR/<node>/pause-heartbeat`; deleting
the file resumes them (the Node turns Ready again with the next status update). With
`STATE_DIR/<node>/dead` the node's kubelet is gone (`dead`): no heartbeat, and nothing of its
pods reaches the apiserver either, no status and no final delete (pods.py), so a pod deleted
there stays Terminating, as on a node that was powered off; its processes run on, as on a
node cut off from the apiserver. Deleting the file brings the kubelet back.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from . import kapi

log = logging.getLogger(__name__)


def dead_marker(state_dir: Path, node: str) -> Path:
    """The file whose presence says the node's kubelet is gone (see the module's doc)."""
    return state_dir / node / "dead"


KUBELET_VERSION = "v1.37.2"  # what cluster/build.sh builds by default
LEASE_SECONDS = 40
RENEW_SECONDS = 10.0


@dataclass(frozen=True)
class NodeConfig:
    name: str
    index: int
    cpu: str = "8"
    memory: str = "32Gi"
    gpus: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, Any]] = ()
    # Seconds this node's clock is ahead of the host's (negative: behind).
    clock_skew_seconds: float = 0.0

    @staticmethod
    def from_json(index: int, d: Mapping[str, Any]) -> NodeConfig:
        return NodeConfig(
            name=d["name"],
            index=index,
            cpu=str(d.get("cpu", "8")),
            memory=str(d.get("memory", "32Gi")),
            gpus=int(d.get("gpus", 0)),
            labels=dict(d.get("labels") or {}),
            taints=list(d.get("taints") or []),
            clock_skew_seconds=float(d.get("clockSkewSeconds", 0)),
        )

    def capacity(self) -> dict[str, str]:
        cap = {"cpu": self.cpu, "memory": self.memory, "pods": "110", "ephemeral-storage": "100Gi"}
        if self.gpus > 0:
            cap["nvidia.com/gpu"] = str(self.gpus)
        return cap


def node_now(skew_seconds: float = 0.0) -> dt.datetime:
    """Now by a node's clock: the host's, `skew_seconds` ahead (negative: behind)."""
    return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=skew_seconds)


def now_rfc3339(skew_seconds: float = 0.0) -> str:
    return node_now(skew_seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro(skew_seconds: float = 0.0) -> str:
    return node_now(skew_seconds).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_object(cfg: NodeConfig) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": cfg.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        **cfg.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": cfg.name, "labels": labels},
        "spec": {"taints": [dict(t) for t in cfg.taints]} if cfg.taints else {},
    }


def node_status(
    cfg: NodeConfig, internal_ip: str, now: str, started: str, kubelet_port: int = 0
) -> dict[str, Any]:
    """`kubelet_port`: where the apiserver asks for logs (localkube.node.logserver); 0: none."""

    def cond(ctype: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": started,
        }

    return {
        "capacity": cfg.capacity(),
        "allocatable": cfg.capacity(),
        "conditions": [
            cond(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            cond(
                "DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"
            ),
            cond(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            cond("Ready", "True", "KubeletReady", "localkube process node is posting ready status"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": internal_ip},
            {"type": "Hostname", "address": cfg.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": "amd64",
            "containerRuntimeVersion": "localkube://0.1",
            "osImage": "localkube process node",
            "kernelVersion": "",
            "machineID": cfg.name,
            "systemUUID": cfg.name,
            "bootID": started,
        },
    }


class NodeAgent:
    """Registers one Node and keeps its Lease and heartbeat fresh in a thread."""

    def __init__(
        self,
        api: client.ApiClient,
        cfg: NodeConfig,
        internal_ip: str,
        state_dir: Path,
        stop: threading.Event,
        kubelet_port: int = 0,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.kubelet_port = kubelet_port
        self.coord = client.CoordinationV1Api(api)
        self.cfg, self.ip, self.stop = cfg, internal_ip, stop
        self.pause_file = state_dir / cfg.name / "pause-heartbeat"
        self.dead_file = dead_marker(state_dir, cfg.name)
        self.pause_file.parent.mkdir(parents=True, exist_ok=True)
        self.started = now_rfc3339(cfg.clock_skew_seconds)
        self.node_uid = ""
        self.thread = threading.Thread(target=self._loop, name=f"node-{cfg.name}", daemon=True)

    @property
    def paused(self) -> bool:
        return self.pause_file.exists() or self.dead_file.exists()

    def register(self) -> None:
        body = node_object(self.cfg)
        try:
            node = kapi.raw(self.core.create_node, body)
        except ApiException as e:
            if e.status != 409:
                raise
            patch = {"metadata": {"labels": body["metadata"]["labels"]}}
            node = kapi.raw(
                self.core.patch_node, self.cfg.name, patch, _content_type=kapi.MERGE_PATCH
            )
        self.node_uid = node["metadata"]["uid"]
        self.heartbeat()

    def heartbeat(self) -> None:
        now = now_rfc3339(self.cfg.clock_skew_seconds)
        status = node_status(self.cfg, self.ip, now, self.started, self.kubelet_port)
        kapi.retry(
            lambda: self.core.patch_node_status(
                self.cfg.name, {"status": status}, _content_type=kapi.MERGE_PATCH
            ),
            f"node {self.cfg.name} status",
            stop=self.stop.is_set,
        )
        self.renew_lease()

    def renew_lease(self) -> None:
        name, ns = self.cfg.name, "kube-node-lease"
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": ns,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self.node_uid}
                ],
            },
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": now_micro(self.cfg.clock_skew_seconds),
            },
        }
        try:
            self.coord.patch_namespaced_lease(
                name, ns, {"spec": lease["spec"]}, _content_type=kapi.MERGE_PATCH
            )
        except ApiException as e:
            if e.status != 404:
                raise
            kapi.raw(self.coord.create_namespaced_lease, ns, lease)

    def _loop(self) -> None:
        while not self.stop.wait(RENEW_SECONDS):
            if self.paused:
                continue
            try:
                self.heartbeat()
            except Exception as e:  # keep beating; the apiserver may be briefly away
                log.warning("heartbeat of %s failed: %s", self.cfg.name, e)
