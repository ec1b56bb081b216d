"""spec.scheduling: gang scheduling and topology placement (docs/scheduling.md).

Imported by api/spec.py and api/status.py; its base classes are api/wire.py's."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .wire import Rule, _Wire

# Who schedules a job's pods as one gang:
#   None          the pods are scheduled one by one (whatever schedulerName the template names)
#   Native        kube-scheduler's own gang scheduling: a Workload and a PodGroup
#                 (scheduling.k8s.io/v1beta1, Kubernetes >= 1.37 with the GenericWorkload
#                 feature gate), the pods name the PodGroup in spec.schedulingGroup
#   Coscheduling  scheduler-plugins' coscheduling: a PodGroup (scheduling.x-k8s.io/v1alpha1),
#                 the pods carry its label and that scheduler's name
#   Volcano       Volcano: a PodGroup (scheduling.volcano.sh/v1beta1), the pods carry its
#                 annotation and schedulerName volcano
Gang = Literal["None", "Native", "Coscheduling", "Volcano"]

# The schedulerName each gang scheduler runs under unless spec.scheduling.schedulerName says
# otherwise: scheduler-plugins' "as a second scheduler" install, and Volcano's own.
DEFAULT_SCHEDULER_NAMES: dict[str, str] = {
    "Coscheduling": "scheduler-plugins-scheduler",
    "Volcano": "volcano",
}

# A Kubernetes label key: an optional DNS-subdomain prefix and a name of at most 63 characters.
_LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
# A DNS-1123 subdomain (scheduler and queue names).
_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
Subdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=_SUBDOMAIN_PATTERN)]

_EXCLUSIVE_NEEDS_KEY = Rule(
    "!has(self.exclusive) || !self.exclusive || has(self.topologyKey)",
    "placement.exclusive needs placement.topologyKey: the domain the job has to itself",
    ".exclusive",
)


class Placement(_Wire):
    """Where the pods go, rendered as pod affinity and anti-affinity (docs/scheduling.md)."""

    RULES = (_EXCLUSIVE_NEEDS_KEY,)

    topology_key: (
        Annotated[str, Field(min_length=1, max_length=317, pattern=_LABEL_KEY_PATTERN)] | None
    ) = None
    """A node label key, e.g. topology.kubernetes.io/rack: every pod of an attempt runs on
    nodes with the same value of it (one rack, one NVLink domain). Unset: anywhere."""
    exclusive: bool = False
    """With topologyKey: no pod of another DistributedTrainingJob (in any namespace) shares the
    domain, as JobSet's exclusive placement does. Pods of other kinds are not kept out: taint
    the domain's nodes for that."""
    one_pod_per_node: bool = False
    """No two pods of DistributedTrainingJobs (this one or another) share a node."""

    @model_validator(mode="after")
    def _check(self) -> Placement:
        if self.exclusive and self.topology_key is None:
            raise ValueError(_EXCLUSIVE_NEEDS_KEY.message)
        return self


_SCHEDULER_NAME_NEEDS_GANG = Rule(
    "!has(self.schedulerName) || (has(self.gang) && self.gang != 'None')",
    "scheduling.schedulerName needs a gang (Native, Coscheduling or Volcano); without one, "
    "set template.spec.schedulerName",
    ".schedulerName",
)
_TIMEOUT_NEEDS_COSCHEDULING = Rule(
    "!has(self.scheduleTimeoutSeconds) || (has(self.gang) && self.gang == 'Coscheduling')",
    "scheduling.scheduleTimeoutSeconds is coscheduling's: it needs gang Coscheduling",
    ".scheduleTimeoutSeconds",
)
_QUEUE_NEEDS_VOLCANO = Rule(
    "!has(self.queue) || (has(self.gang) && self.gang == 'Volcano')",
    "scheduling.queue is Volcano's queue: it needs gang Volcano",
    ".queue",
)


class Scheduling(_Wire):
    """How the pods are scheduled: as one gang (all of an attempt's pods or none), and where."""

    RULES = (_SCHEDULER_NAME_NEEDS_GANG, _TIMEOUT_NEEDS_COSCHEDULING, _QUEUE_NEEDS_VOLCANO)

    gang: Gang = "None"
    """None (default): pods are scheduled one by one. Native: kube-scheduler's gang
    scheduling (Kubernetes 1.37+, GenericWorkload feature gate and scheduling.k8s.io/v1beta1
    enabled); the operator owns a Workload and a PodGroup per attempt. Coscheduling: the
    scheduler-plugins coscheduling plugin (PodGroup scheduling.x-k8s.io/v1alpha1). Volcano:
    Volcano (PodGroup scheduling.volcano.sh/v1beta1). Each gang needs the pods of the attempt
    to be placed together: minNodes of them for an elastic job, nodes otherwise."""
    scheduler_name: Subdomain | None = None
    """The pods' schedulerName with a gang. Unset: the template's; else
    scheduler-plugins-scheduler for Coscheduling, volcano for Volcano, the default scheduler
    for Native."""
    queue: Subdomain | None = None
    """Volcano's queue for the PodGroup. Unset: Volcano's default queue."""
    schedule_timeout_seconds: Annotated[int, Field(ge=1, le=24 * 3600)] | None = None
    """Coscheduling's scheduleTimeoutSeconds (how long the gang may wait at the permit stage).
    Unset: the plugin's default."""
    placement: Placement = Placement()
    """Where the pods go."""

    @model_validator(mode="after")
    def _check(self) -> Scheduling:
        if self.scheduler_name is not None and self.gang == "None":
            raise ValueError(_SCHEDULER_NAME_NEEDS_GANG.message)
        if self.queue is not None and self.gang != "Volcano":
            raise ValueError(_QUEUE_NEEDS_VOLCANO.message)
        if self.schedule_timeout_seconds is not None and self.gang != "Coscheduling":
            raise ValueError(_TIMEOUT_NEEDS_COSCHEDULING.message)
        return self


class SchedulingStatus(_Wire):
    """The gang objects of the current attempt, recorded before they are created and before
    older attempts' are deleted."""

    gang: Gang
    """The gang scheduler the objects are for."""
    attempt: int
    """The attempt they belong to."""
    pod_group: str
    """The name of the attempt's PodGroup (and, for Native, of its Workload)."""
