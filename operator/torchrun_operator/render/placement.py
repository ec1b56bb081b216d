"""spec.scheduling.placement as pod affinity and anti-affinity (docs/scheduling.md).

The terms select the job's pods by a label carrying the job's uid, so that a job of the same
name in another namespace, or a re-created job, is another job; the attempt label keeps a
terminating pod of an earlier attempt from pinning the new one to its old domain. Like
JobSet's exclusive placement, exclusivity is anti-affinity to every other
DistributedTrainingJob pod in any namespace (an empty namespaceSelector); required
anti-affinity is symmetric in kube-scheduler, so their pods stay out of our domain too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..api import names
from ..api.spec import JobSpec

# The job's uid on every pod of a job with a placement: the selector of its affinity terms.
LABEL_JOB_UID = f"{names.GROUP}/job-uid"
HOSTNAME_KEY = "kubernetes.io/hostname"


def _this_attempt(uid: str, attempt: int) -> dict[str, Any]:
    return {
        "matchExpressions": [
            {"key": LABEL_JOB_UID, "operator": "In", "values": [uid]},
            {"key": names.LABEL_ATTEMPT, "operator": "In", "values": [str(attempt)]},
        ]
    }


def _other_jobs(uid: str) -> dict[str, Any]:
    # NotIn also matches pods without the uid label: other jobs that set no placement.
    return {
        "matchExpressions": [
            {"key": names.LABEL_JOB_NAME, "operator": "Exists"},
            {"key": LABEL_JOB_UID, "operator": "NotIn", "values": [uid]},
        ]
    }


def _any_job() -> dict[str, Any]:
    return {"matchExpressions": [{"key": names.LABEL_JOB_NAME, "operator": "Exists"}]}


def placement_terms(
    spec: JobSpec, uid: str, attempt: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(required pod affinity terms, required pod anti-affinity terms)."""
    placement = spec.scheduling.placement
    affinity: list[dict[str, Any]] = []
    anti: list[dict[str, Any]] = []
    if placement.topology_key:
        affinity.append(
            {"labelSelector": _this_attempt(uid, attempt), "topologyKey": placement.topology_key}
        )
        if placement.exclusive:
            anti.append(
                {
                    "labelSelector": _other_jobs(uid),
                    "topologyKey": placement.topology_key,
                    "namespaceSelector": {},
                }
            )
    if placement.one_pod_per_node:
        anti.append(
            {"labelSelector": _any_job(), "topologyKey": HOSTNAME_KEY, "namespaceSelector": {}}
        )
    return affinity, anti


def avoid_nodes(metadata: dict[str, Any], pod_spec: dict[str, Any], nodes: Sequence[str]) -> None:
    """Keeps the pod off `nodes` (status.avoidedNodes, reconcile/failure/avoid.py): a required
    node affinity on the node's name (metadata.name, what the pod's spec.nodeName recorded;
    the kubernetes.io/hostname label usually equals it but need not). The template's terms
    stay: the requirement is added to each of its node selector terms (they are ORed, their
    requirements ANDed), or is the only term. The annotation ANNOTATION_AVOIDED_NODES names
    the same nodes: the affinity alone cannot tell them from a NotIn of the template's own.
    The operator's alone: a template's value of it is dropped."""
    kept = sorted(set(nodes))
    key = names.ANNOTATION_AVOIDED_NODES
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != key}
    if kept:
        annotations[key] = ",".join(kept)
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    if not kept:
        return
    # One requirement a node: the apiserver takes a single value in a matchFields In/NotIn
    # ("must be only one value when `operator` is 'In' or 'NotIn' for node field selector"),
    # so one NotIn of two nodes got every pod create refused (422).
    requirements = [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in kept]
    node_affinity = pod_spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    selector = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = selector.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchFields", []).extend(
            dict(r, values=list(r["values"])) for r in requirements
        )


def apply_to_pod(
    job: dict[str, Any], spec: JobSpec, metadata: dict[str, Any], pod_spec: dict[str, Any]
) -> None:
    """Adds the placement's terms to the pod's own affinity (the template's terms stay)."""
    uid = str(job["metadata"]["uid"])
    attempt = int(metadata["labels"][names.LABEL_ATTEMPT])
    affinity, anti = placement_terms(spec, uid, attempt)
    if not affinity and not anti:
        return
    metadata["labels"][LABEL_JOB_UID] = uid
    current = pod_spec.setdefault("affinity", {})
    for key, terms in (("podAffinity", affinity), ("podAntiAffinity", anti)):
        if terms:
            section = current.setdefault(key, {})
            required = section.setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
            required.extend(terms)
