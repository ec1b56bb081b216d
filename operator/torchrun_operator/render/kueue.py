"""Kueue: the Workload a queued job is admitted through, and what admission puts into its pods.

A job labelled `kueue.x-k8s.io/queue-name` is admitted by Kueue as one unit through a Workload
that the operator renders, creates, owns (controller uid) and follows, as Kueue's own job
integrations do (docs/scheduling.md, "Kueue"). One pod set, `workers`, asks for the most pods
the job can run (spec.nodes, or elastic.maxNodes) with the user's pod template, so the quota
Kueue reserves covers every pod the job may create.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..api import names
from .common import child_metadata
from .sizing import job_spec

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
WORKLOADS = "workloads"
RESOURCE_FLAVORS = "resourceflavors"
PRIORITY_CLASSES = "workloadpriorityclasses"
# The labels Kueue reads on a job (the same ones its own integrations read).
QUEUE_LABEL = f"{GROUP}/queue-name"
# A WorkloadPriorityClass: the Workload's priority, read when the Workload is created.
PRIORITY_LABEL = f"{GROUP}/priority-class"
# Kueue's job integrations label their Workloads with the job's uid; so do we.
JOB_UID_LABEL = f"{GROUP}/job-uid"
# Kueue labels the pods of an admitted pod set with its name.
PODSET_LABEL = f"{GROUP}/podset"
PODSET = "workers"
# A hash of what the Workload was rendered from (pod set and queue): a job changed while it
# waits (nodes, template, queue) gets a new Workload, which Kueue's podSets do not allow in
# place. Compared by hash, not field by field: the apiserver defaults fields of the template.
SPEC_HASH_ANNOTATION = f"{names.GROUP}/workload-spec-hash"
# Set on a Workload the operator deactivated because the job's runPolicy.suspend is true, so
# that resuming the job reactivates only what the operator deactivated, never a Workload that
# a person or Kueue deactivated.
DEACTIVATED_ANNOTATION = f"{names.GROUP}/deactivated-by-suspend"
# Workload names are DNS subdomains.
_HASH_CHARS = 8


def queue_name(job: Mapping[str, Any]) -> str | None:
    """The LocalQueue the job asks for, None when it is not queued through Kueue."""
    value = ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    return str(value) if value else None


def priority_class(job: Mapping[str, Any]) -> str | None:
    """The WorkloadPriorityClass the job names, None if none."""
    value = ((job.get("metadata") or {}).get("labels") or {}).get(PRIORITY_LABEL)
    return str(value) if value else None


def workload_name(job: Mapping[str, Any]) -> str:
    """`dtj-<job>-<hash of its uid>`: a job deleted and re-created under the same name gets
    a new Workload name, so the predecessor's (garbage collected later) is never in its way."""
    meta = job["metadata"]
    digest = hashlib.sha256(str(meta["uid"]).encode()).hexdigest()[:_HASH_CHARS]
    head = f"dtj-{meta['name']}"[: names.MAX_OBJECT_NAME_LENGTH - _HASH_CHARS - 1]
    return f"{head.rstrip('-.')}-{digest}"


def _pod_set(job: Mapping[str, Any]) -> dict[str, Any]:
    spec = job_spec(dict(job))
    template = copy.deepcopy(job["spec"]["template"])
    template.setdefault("metadata", {})
    pod_set: dict[str, Any] = {"name": PODSET, "count": spec.max_nodes, "template": template}
    if spec.is_elastic:
        # Kueue's partial admission may then admit fewer pods, down to what the job can run.
        pod_set["minCount"] = spec.min_nodes
    return pod_set


def _spec_hash(spec: Mapping[str, Any]) -> str:
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def render_workload(
    job: Mapping[str, Any], active: bool = True, priority: int | None = None
) -> dict[str, Any]:
    """The job's Workload. `active` false: created deactivated (a suspended job).
    `priority`: the value of the job's WorkloadPriorityClass (priority_class), which Kueue
    orders and preempts by; as with Kueue's own integrations it is fixed at creation, so it is
    not part of the spec hash."""
    queue = queue_name(job)
    if queue is None:
        raise ValueError("the job has no kueue.x-k8s.io/queue-name label")
    spec: dict[str, Any] = {"queueName": queue, "podSets": [_pod_set(job)]}
    meta = child_metadata(dict(job), workload_name(job))
    meta["labels"][JOB_UID_LABEL] = str(job["metadata"]["uid"])
    meta["annotations"] = {SPEC_HASH_ANNOTATION: _spec_hash(spec)}
    name = priority_class(job)
    if name is not None and priority is not None:
        spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": name}
        spec["priority"] = priority
    if not active:
        spec["active"] = False
        meta["annotations"][DEACTIVATED_ANNOTATION] = "true"
    return {"apiVersion": API_VERSION, "kind": "Workload", "metadata": meta, "spec": spec}


def spec_hash(workload: Mapping[str, Any]) -> str | None:
    return ((workload.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)


def assigned_flavors(workload: Mapping[str, Any]) -> list[str]:
    """The ResourceFlavors Kueue assigned to the job's pod set, in order, without repeats."""
    admission = (workload.get("status") or {}).get("admission") or {}
    out: list[str] = []
    for psa in admission.get("podSetAssignments") or []:
        if psa.get("name") == PODSET:
            for flavor in (psa.get("flavors") or {}).values():
                if flavor not in out:
                    out.append(str(flavor))
    return out


def pod_set_info(
    workload: Mapping[str, Any], flavors: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """What admission puts into every pod, as Kueue's job integrations do: each assigned
    ResourceFlavor's nodeLabels (as nodeSelector) and tolerations, the pod-set label, and the
    labels, annotations, nodeSelector and tolerations that admission checks ask for.
    `flavors`: the assigned ResourceFlavors by name, as read from the API."""
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    labels: dict[str, str] = {PODSET_LABEL: PODSET}
    annotations: dict[str, str] = {}
    for name in assigned_flavors(workload):
        fspec = (flavors.get(name) or {}).get("spec") or {}
        node_selector.update(fspec.get("nodeLabels") or {})
        tolerations.extend(fspec.get("tolerations") or [])
    for check in (workload.get("status") or {}).get("admissionChecks") or []:
        for update in check.get("podSetUpdates") or []:
            if update.get("name") == PODSET:
                labels.update(update.get("labels") or {})
                annotations.update(update.get("annotations") or {})
                node_selector.update(update.get("nodeSelector") or {})
                tolerations.extend(update.get("tolerations") or [])
    return {
        "labels": labels,
        "annotations": annotations,
        "nodeSelector": node_selector,
        "tolerations": tolerations,
    }


def with_pod_set_info(job: Mapping[str, Any], info: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the job whose template carries `info` (pod_set_info): its pods are rendered
    from it. The job object in the API is never changed; admission is re-read every time.
    Where the template and the admission disagree on a node selector key, the admission wins
    (it is what the quota was reserved on)."""
    out = copy.deepcopy(dict(job))
    template = out["spec"]["template"]
    tmeta = template.setdefault("metadata", {})
    if info.get("labels"):
        tmeta["labels"] = {**(tmeta.get("labels") or {}), **info["labels"]}
    if info.get("annotations"):
        tmeta["annotations"] = {**(tmeta.get("annotations") or {}), **info["annotations"]}
    pod_spec = template["spec"]
    if info.get("nodeSelector"):
        pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **info["nodeSelector"]}
    extra = [
        t for t in info.get("tolerations") or [] if t not in (pod_spec.get("tolerations") or [])
    ]
    if extra:
        pod_spec["tolerations"] = [*(pod_spec.get("tolerations") or []), *extra]
    return out
