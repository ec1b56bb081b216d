"""The NetworkPolicy that keeps a job's pods reachable only from the job's own pods.

What it admits, and why not less: the c10d rendezvous port (spec.rendezvous.port, served by
pod 0's TCPStore) must be reachable from every pod of the job and from nothing else, because
anything that can reach the store can join the rendezvous, read or overwrite its keys, and
so hijack or stall the training. But a policy that admitted only that port would break
every job: once a pod is selected by an Ingress policy, everything not admitted by some
policy is dropped, and the collectives' own traffic does not use the rendezvous port. gloo
and NCCL's socket transport listen on ephemeral ports (bootstrap, ring and tree
connections), torch's per-round TCPStore (when TORCH_DISABLE_SHARE_RDZV_TCP_STORE is set)
too, and those ports cannot be known in advance. So the policy admits every port and
protocol from the job's own pods, and nothing from anywhere else.

Why not "restrict the rendezvous port, leave the other ports as they were": NetworkPolicies
only ever add what they admit. Leaving the other ports open would take a rule admitting them
from everywhere, which would punch through a namespace's default-deny policy. Admitting from
the job's pods only is the one choice that never widens what a cluster already allows; a user
who wants more (Prometheus scraping a trainer, TensorBoard) adds a policy of their own, which
adds to this one. See docs/security.md.
"""

from __future__ import annotations

from typing import Any

from ..api import names
from .common import child_metadata
from .sizing import job_spec

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"


def wants_network_policy(job: dict[str, Any], default: bool) -> bool:
    """spec.networkPolicy.enabled when the job sets it, else the operator's default
    (--network-policy / --no-network-policy)."""
    enabled = job_spec(job).network_policy.enabled
    return default if enabled is None else enabled


def render_network_policy(job: dict[str, Any]) -> dict[str, Any]:
    """Ingress only: egress (DNS, the dataset, the checkpoint store) is none of the operator's
    business. The peer is a podSelector without a namespaceSelector, so it matches pods of the
    job's own namespace only: a pod elsewhere carrying the same label is not admitted."""
    name = job["metadata"]["name"]
    job_pods = {"matchLabels": {names.LABEL_JOB_NAME: name}}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        # Named after the job, like the Service: one per job, found by name.
        "metadata": child_metadata(job, name),
        "spec": {
            "podSelector": job_pods,
            "policyTypes": ["Ingress"],
            # No `ports`: every port and protocol, the rendezvous port included, from the
            # job's pods alone (module docstring: the collectives' ports are ephemeral).
            "ingress": [{"from": [{"podSelector": job_pods}]}],
        },
    }
