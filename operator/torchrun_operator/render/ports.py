"""The ports a job's pods listen on: the c10d rendezvous port (pod 0) and the launcher's status
port (every pod).

On the pod network each pod has its own address, so every job uses the same ports:
spec.rendezvous.port and the pod contract's STATUS_PORT. A host-network pod (the template's
hostNetwork: true, docs/runtimes.md) listens on its node's address, shared with every other
host-network pod there, so each host-network job gets a pair of its own: HOST_PORT_BASE plus
an even offset from a hash of the job's uid, the status port one above. An explicit
spec.rendezvous.port is kept as given (it is then the job's to keep apart).

Two jobs whose hashes meet still never share a node: with hostNetwork the apiserver makes each
container port a host port, and the scheduler places no two pods with the same host port on
one node. For the same reason two pods of one host-network job never share a node.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..api.spec import JobSpec
from ..launcher import contract
from .sizing import job_spec

# Host-network pairs lie in [HOST_PORT_BASE, HOST_PORT_BASE + 2 * HOST_PORT_PAIRS): below the
# NodePort range (30000-32767) and Linux's ephemeral ports (32768-60999), above the common
# service ports.
HOST_PORT_BASE = 20000
HOST_PORT_PAIRS = 4000


def host_network(job: dict[str, Any]) -> bool:
    template = (job.get("spec") or {}).get("template") or {}
    return bool((template.get("spec") or {}).get("hostNetwork"))


def ports(job: dict[str, Any], spec: JobSpec | None = None) -> tuple[int, int]:
    """(rendezvous port, status port) of the job's pods."""
    spec = spec or job_spec(job)
    if not host_network(job):
        return spec.rendezvous.port, contract.STATUS_PORT
    digest = hashlib.sha256(str(job["metadata"]["uid"]).encode()).digest()
    base = HOST_PORT_BASE + 2 * (int.from_bytes(digest[:8], "big") % HOST_PORT_PAIRS)
    explicit = "port" in spec.rendezvous.model_fields_set
    rendezvous = spec.rendezvous.port if explicit else base
    status = base + 1 if rendezvous != base + 1 else base
    return rendezvous, status


def rendezvous_port(job: dict[str, Any]) -> int:
    return ports(job)[0]


def status_port(job: dict[str, Any]) -> int:
    return ports(job)[1]
