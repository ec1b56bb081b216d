"""A directory every pod of a job mounts, which outlives the job's pods and which the test reads
back: where training keeps its checkpoints across a gang restart.

On the local cluster it is a hostPath of this host (every process node is this host, so every
pod sees the same directory) and the test reads it directly. On another cluster (kind) it is a
ReadWriteOnce claim of the default StorageClass: its volume is bound to the node of the first
pod that uses it, the scheduler puts every later pod that mounts it on that node, and the test
reads a file through a short-lived pod that mounts the claim and prints it (its log, through
the API). A ReadWriteMany claim would let the pods spread over nodes; kind's local-path
provisioner has none, and the tests that use this directory need no spreading.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from dtj import IMAGE, pod_log, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube.controlplane import Cluster

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


class SharedDir:
    def __init__(self, cluster: Any, kube: client.ApiClient, namespace: str, host_dir: Path):
        self.kube = kube
        self.namespace = namespace
        self.local = isinstance(cluster, Cluster)
        self.host_dir = host_dir
        self.claim = f"shared-{secrets.token_hex(3)}"
        if self.local:
            host_dir.mkdir(parents=True, exist_ok=True)
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

    def volume(self) -> dict[str, Any]:
        """The pod volume's source (no name)."""
        if self.local:
            return {"hostPath": {"path": str(self.host_dir), "type": "DirectoryOrCreate"}}
        return {"persistentVolumeClaim": {"claimName": self.claim}}

    def read(self, relative: str) -> str | None:
        """The file's text, or None where it is not there."""
        if self.local:
            path = self.host_dir / relative
            return path.read_text() if path.is_file() else None
        text = self._in_pod("text", relative)
        return None if text == MISSING else text

    def is_file(self, relative: str) -> bool:
        if self.local:
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
