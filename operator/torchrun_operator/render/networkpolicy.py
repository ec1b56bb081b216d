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

One more port is admitted from one more peer: the launcher's read-only status endpoint (the pod
contract's STATUS_PORT, or a host-network job's own: render/ports.py), which the operator reads
for the live rank map and progress, from the operator's own pods (its namespace, and the label
the chart gives them) and from nothing else, so it too never widens what a cluster allows. An
operator that does not know its namespace (it runs outside the cluster) cannot be named by a
policy: the rule is left out, and reads from outside the pod network are the CNI's business
(nodes are admitted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..api import names
from .common import child_metadata
from .ports import status_port
from .sizing import job_spec

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"
# The label the chart gives the operator's pods.
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "torchrun-operator"}
# Every namespace carries it (Kubernetes >= 1.21 sets it, immutable).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class OperatorPeer:
    """Where the operator's pods run, to admit them to the launcher's status port."""

    namespace: str
    labels: dict[str, str] = field(default_factory=lambda: dict(OPERATOR_POD_LABELS))


def wants_network_policy(job: dict[str, Any], default: bool) -> bool:
    """spec.networkPolicy.enabled when the job sets it, else the operator's default
    (--network-policy / --no-network-policy)."""
    enabled = job_spec(job).network_policy.enabled
    return default if enabled is None else enabled


def render_network_policy(
    job: dict[str, Any], operator: OperatorPeer | None = None
) -> dict[str, Any]:
    """Ingress only: egress (DNS, the dataset, the checkpoint store) is none of the operator's
    business. The peer is a podSelector without a namespaceSelector, so it matches pods of the
    job's own namespace only: a pod elsewhere carrying the same label is not admitted. With
    `operator`, its pods may also reach the status port (and only that port)."""
    name = job["metadata"]["name"]
    job_pods = {"matchLabels": {names.LABEL_JOB_NAME: name}}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": job_pods}]}]
    if operator is not None:
        ingress.append(
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {NAMESPACE_NAME_LABEL: operator.namespace}
                        },
                        "podSelector": {"matchLabels": dict(operator.labels)},
                    }
                ],
                "ports": [{"port": status_port(job), "protocol": "TCP"}],
            }
        )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        # Named after the job, like the Service: one per job, found by name.
        "metadata": child_metadata(job, name),
        "spec": {
            "podSelector": job_pods,
            "policyTypes": ["Ingress"],
            # The first rule has no `ports`: every port and protocol, the rendezvous port
            # included, from the job's pods alone (module docstring: the collectives' ports
            # are ephemeral). The second, the status port from the operator's pods.
            "ingress": ingress,
        },
    }
