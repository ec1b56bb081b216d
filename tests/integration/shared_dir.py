"""A directory every pod of a job mounts, which outlives the job's pods and which the test reads
back: where training keeps its checkpoints across a gang restart.

On the local cluster it is a hostPath of this host (every process node is this host, so every
pod sees the same directory) and the test reads it directly. On kind clusters of this host
made by hack/kind.sh, every worker mounts one directory of this host at /shared: the pods use
a hostPath under it, which is the same directory on every node, and the test reads it
directly too. On any other cluster it is a ReadWriteOnce claim of the default StorageClass:
its volume is bound to the node of the first pod that uses it, the scheduler puts every later
pod that mounts it on that node (`spans_nodes` is False), and the test reads a file through a
short-lived pod that mounts the claim and prints it (its log, through the API).
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

from dtj import IMAGE, pod_log, schedulable_nodes, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube.controlplane import Cluster
from nodes import node_containers

# What the reader pod prints for a file that is not there (a file's text is never this).
MISSING = "<<shared_dir: no such file>>"
# argv: "text" or "exists", then the file's path under the directory.
READER = f"""\
import os, sys
path = os.path.join("/shared", sys.argv[2])
if not os.path.isfile(path):
    print({MISSING!r}, end="")
elif sys.argv[1] == "text":
    print(open(path).read(), end="")
"""


# Where hack/kind.sh mounts the shared directory in every worker (SHARED_MOUNT there).
KIND_MOUNT = "/shared"


def kind_shared_dir(kube: client.ApiClient) -> Path | None:
    """The directory of this host that every schedulable node of a kind cluster mounts at
    KIND_MOUNT; None when the cluster is no kind cluster of this host or a node lacks it."""
    containers = node_containers(kube)
    sources: set[str] = set()
    for node in schedulable_nodes(kube):
        container = containers.get(node.metadata.name)
        if container is None:
            return None
        out = subprocess.run(
            ["docker", "inspect", "-f", "{{json .Mounts}}", container],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        mounts = json.loads(out or "[]") or []
        source = next((m.get("Source") for m in mounts if m.get("Destination") == KIND_MOUNT), None)
        if source is None:
            return None
        sources.add(source)
    return Path(sources.pop()) if len(sources) == 1 else None


class SharedDir:
    def __init__(self, cluster: Any, kube: client.ApiClient, namespace: str, host_dir: Path):
        self.kube = kube
        self.namespace = namespace
        local = isinstance(cluster, Cluster)
        self.claim = f"shared-{secrets.token_hex(3)}"
        # On kind: the pods' hostPath (under KIND_MOUNT on the node) and this host's path.
        self.node_path: str | None = None
        shared = None if local else kind_shared_dir(kube)
        if shared is not None:
            self.node_path = f"{KIND_MOUNT}/{namespace}-{self.claim}"
            host_dir = shared / f"{namespace}-{self.claim}"
        self.host_dir = host_dir
        # Read from this host (its path is host_dir), or through a pod that mounts the claim.
        self.on_host = local or shared is not None
        if self.on_host:
            host_dir.mkdir(parents=True, exist_ok=True)
            if shared is not None:
                host_dir.chmod(0o777)  # for pods of any user, as a fresh volume would be
            return
        claim: Any = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": self.claim},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        client.CoreV1Api(kube).create_namespaced_persistent_volume_claim(namespace, claim)

    @property
    def spans_nodes(self) -> bool:
        """Whether pods on different nodes share it (not a ReadWriteOnce claim's)."""
        return self.on_host

    def volume(self) -> dict[str, Any]:
        """The pod volume's source (no name)."""
        if self.on_host:
            path = self.node_path or str(self.host_dir)
            return {"hostPath": {"path": path, "type": "DirectoryOrCreate"}}
        return {"persistentVolumeClaim": {"claimName": self.claim}}

    def read(self, relative: str) -> str | None:
        """The file's text, or None where it is not there."""
        if self.on_host:
            path = self.host_dir / relative
            return path.read_text() if path.is_file() else None
        text = self._in_pod("text", relative)
        return None if text == MISSING else text

    def is_file(self, relative: str) -> bool:
        if self.on_host:
            return (self.host_dir / relative).is_file()
        return self._in_pod("exists", relative) != MISSING

    def _in_pod(self, mode: str, relative: str) -> str:
        core = client.CoreV1Api(self.kube)
        name = f"{self.claim}-read-{secrets.token_hex(3)}"
        pod: Any = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "read",
                        "image": IMAGE,
                        "command": ["python", "-c", READER, mode, relative],
                        "volumeMounts": [
                            {"name": "shared", "mountPath": "/shared", "readOnly": True}
                        ],
                    }
                ],
                "volumes": [{"name": "shared", **self.volume()}],
            },
        }
        core.create_namespaced_pod(self.namespace, pod)
        try:

            def finished() -> str | None:
                phase = core.read_namespaced_pod(name, self.namespace).status.phase  # type: ignore[union-attr]
                assert phase != "Failed", pod_log(self.kube, self.namespace, name, "read")
                return phase if phase == "Succeeded" else None

            wait_for(f"the reader pod {name}", finished, timeout=120)
            return pod_log(self.kube, self.namespace, name, "read")
        finally:
            try:
                core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
            except ApiException as e:
                if e.status != 404:
                    raise
