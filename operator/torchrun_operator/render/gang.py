"""Gang scheduling objects per attempt, and what they ask of each pod (docs/scheduling.md).

Native (kube-scheduler, Kubernetes 1.37): a Workload holding one gang PodGroupTemplate, and
the PodGroup made from it, both scheduling.k8s.io/v1beta1; every pod names the PodGroup in
spec.schedulingGroup.podGroupName. Coscheduling (scheduler-plugins): a PodGroup of
scheduling.x-k8s.io/v1alpha1, the pod label scheduling.x-k8s.io/pod-group and that scheduler's
name. Volcano: a PodGroup of scheduling.volcano.sh/v1beta1, the pod annotation
scheduling.k8s.io/group-name and schedulerName volcano.

Every object belongs to one attempt (label torchrun.dev/attempt, name <job>-a<attempt>): a
gang restart starts a fresh gang, whose size and members are those of the new attempt, and
the old one is deleted once the status names the new one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ..api import names
from ..api.scheduling import DEFAULT_SCHEDULER_NAMES
from ..api.spec import JobSpec
from .common import child_metadata
from .sizing import job_spec

NATIVE_GROUP = "scheduling.k8s.io"
NATIVE_VERSION = "v1beta1"
COSCHEDULING_GROUP = "scheduling.x-k8s.io"
COSCHEDULING_VERSION = "v1alpha1"
VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_VERSION = "v1beta1"

# What each gang scheduler reads on a pod to find its group.
COSCHEDULING_POD_LABEL = f"{COSCHEDULING_GROUP}/pod-group"
VOLCANO_POD_ANNOTATION = "scheduling.k8s.io/group-name"
# The Workload's one PodGroupTemplate.
NATIVE_TEMPLATE = "workers"


@dataclass(frozen=True)
class Kind:
    """A kind of gang object, as the API addresses it."""

    group: str
    version: str
    kind: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


WORKLOAD = Kind(NATIVE_GROUP, NATIVE_VERSION, "Workload", "workloads")
NATIVE_POD_GROUP = Kind(NATIVE_GROUP, NATIVE_VERSION, "PodGroup", "podgroups")
COSCHEDULING_POD_GROUP = Kind(COSCHEDULING_GROUP, COSCHEDULING_VERSION, "PodGroup", "podgroups")
VOLCANO_POD_GROUP = Kind(VOLCANO_GROUP, VOLCANO_VERSION, "PodGroup", "podgroups")

# The kinds each gang owns, in creation order (the PodGroup names its Workload).
KINDS: dict[str, tuple[Kind, ...]] = {
    "None": (),
    "Native": (WORKLOAD, NATIVE_POD_GROUP),
    "Coscheduling": (COSCHEDULING_POD_GROUP,),
    "Volcano": (VOLCANO_POD_GROUP,),
}


def gang_name(job_name: str, attempt: int) -> str:
    """<job>-a<attempt>: the Workload and PodGroup of one attempt. At most 63 characters,
    because coscheduling carries it in a label value; a longer job name is shortened and a hash
    of it keeps different jobs apart."""
    suffix = f"-a{attempt}"
    name = job_name + suffix
    if len(name) <= names.MAX_LABEL_LENGTH:
        return name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:6]
    tail = f"-{digest}{suffix}"
    return job_name[: names.MAX_LABEL_LENGTH - len(tail)].rstrip("-") + tail


def min_member(spec: JobSpec) -> int:
    """Pods that must be placed together: an elastic job trains with minNodes of them."""
    return spec.min_nodes


def _metadata(job: dict[str, Any], name: str, attempt: int) -> dict[str, Any]:
    meta = child_metadata(job, name)
    meta["labels"][names.LABEL_ATTEMPT] = str(attempt)
    return meta


def _pod_priority_class(job: dict[str, Any]) -> str | None:
    value = (job["spec"]["template"].get("spec") or {}).get("priorityClassName")
    return str(value) if value else None


def render_gang(job: dict[str, Any], attempt: int) -> list[dict[str, Any]]:
    """The attempt's gang objects, in creation order; none without a gang."""
    spec = job_spec(job)
    gang = spec.scheduling.gang
    name = gang_name(job["metadata"]["name"], attempt)
    count = min_member(spec)
    priority_class = _pod_priority_class(job)
    if gang == "Native":
        policy = {"gang": {"minCount": count}}
        template: dict[str, Any] = {"name": NATIVE_TEMPLATE, "schedulingPolicy": policy}
        group_spec: dict[str, Any] = {
            "workloadRef": {"workloadName": name, "templateName": NATIVE_TEMPLATE},
            "schedulingPolicy": policy,
        }
        if priority_class:
            template["priorityClassName"] = priority_class
            group_spec["priorityClassName"] = priority_class
        workload = {
            "apiVersion": WORKLOAD.api_version,
            "kind": WORKLOAD.kind,
            "metadata": _metadata(job, name, attempt),
            "spec": {
                "controllerRef": {
                    "apiGroup": names.GROUP,
                    "kind": names.KIND,
                    "name": job["metadata"]["name"],
                },
                "podGroupTemplates": [template],
            },
        }
        group = {
            "apiVersion": NATIVE_POD_GROUP.api_version,
            "kind": NATIVE_POD_GROUP.kind,
            "metadata": _metadata(job, name, attempt),
            "spec": group_spec,
        }
        return [workload, group]
    if gang == "Coscheduling":
        cospec: dict[str, Any] = {"minMember": count}
        if spec.scheduling.schedule_timeout_seconds is not None:
            cospec["scheduleTimeoutSeconds"] = spec.scheduling.schedule_timeout_seconds
        return [
            {
                "apiVersion": COSCHEDULING_POD_GROUP.api_version,
                "kind": COSCHEDULING_POD_GROUP.kind,
                "metadata": _metadata(job, name, attempt),
                "spec": cospec,
            }
        ]
    if gang == "Volcano":
        vspec: dict[str, Any] = {"minMember": count}
        if spec.scheduling.queue is not None:
            vspec["queue"] = spec.scheduling.queue
        if priority_class:
            vspec["priorityClassName"] = priority_class
        return [
            {
                "apiVersion": VOLCANO_POD_GROUP.api_version,
                "kind": VOLCANO_POD_GROUP.kind,
                "metadata": _metadata(job, name, attempt),
                "spec": vspec,
            }
        ]
    return []


def scheduler_name(spec: JobSpec, template_value: str | None) -> str | None:
    """The pods' schedulerName: spec.scheduling.schedulerName, else the template's, else the
    gang scheduler's own (None: the cluster's default scheduler)."""
    return (
        spec.scheduling.scheduler_name
        or template_value
        or DEFAULT_SCHEDULER_NAMES.get(spec.scheduling.gang)
    )


def apply_to_pod(
    job: dict[str, Any], spec: JobSpec, metadata: dict[str, Any], pod_spec: dict[str, Any]
) -> None:
    """Points a pod of the attempt (its metadata carries the attempt label) at its gang."""
    gang = spec.scheduling.gang
    if gang == "None":
        return
    attempt = int(metadata["labels"][names.LABEL_ATTEMPT])
    name = gang_name(job["metadata"]["name"], attempt)
    chosen = scheduler_name(spec, pod_spec.get("schedulerName"))
    if chosen:
        pod_spec["schedulerName"] = chosen
    if gang == "Native":
        pod_spec["schedulingGroup"] = {"podGroupName": name}
    elif gang == "Coscheduling":
        metadata["labels"][COSCHEDULING_POD_LABEL] = name
    elif gang == "Volcano":
        metadata.setdefault("annotations", {})[VOLCANO_POD_ANNOTATION] = name
