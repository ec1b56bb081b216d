"""The headless Service that gives every pod a stable DNS name."""

from __future__ import annotations

from typing import Any

from ..api import names
from .common import child_metadata
from .ports import rendezvous_port


def render_service(job: dict[str, Any]) -> dict[str, Any]:
    """Headless and publishing not-ready addresses: rendezvous must resolve before pods are
    Ready, because a pod becomes Ready only once rendezvous is done."""
    name = job["metadata"]["name"]
    port = rendezvous_port(job)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(job, names.service_name(name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {names.LABEL_JOB_NAME: name},
            "ports": [{"name": "c10d", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }
