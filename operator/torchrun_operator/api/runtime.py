"""The training runtimes: ClusterDistributedTrainingRuntime (cluster-scoped) and
DistributedTrainingRuntime (namespaced), generated into CRDs like the job's (api/crd.py).

A runtime holds what a platform team sets once: the pod template (a container named
`trainer` and anything else) and defaults for nprocPerNode, torchrun, rendezvous,
failurePolicy and scheduling. A job names one in spec.runtimeRef and gives only what differs;
api/runtimemerge.py merges the two, and the merged spec is validated by the job's own
model (api/spec.py JobSpec). So these models check only what a runtime alone can get wrong:
its template may leave out what jobs give (the trainer's image and command, typically).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from .bounds import MAX_CONTAINERS, MAX_VOLUME_MOUNTS, MAX_VOLUMES
from .scheduling import Scheduling
from .spec import FailurePolicy, ProcsPerNode, Rendezvous, Torchrun
from .template import Resources, Volume, VolumeMount
from .wire import Rule, _Open, _Wire

TRAINER = "trainer"
Arg = Annotated[str, Field(max_length=65536)]
CLUSTER_KIND = "ClusterDistributedTrainingRuntime"
NAMESPACED_KIND = "DistributedTrainingRuntime"
RuntimeKind = Literal["ClusterDistributedTrainingRuntime", "DistributedTrainingRuntime"]


class PartialContainer(_Open):
    """A container of a runtime's template: as in a Pod, but image and command may be left to
    the jobs. Jobs' containers of the same name are merged onto it."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    """The container's name, unique in the pod; the first must be "trainer"."""
    image: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    """The container image; unset: each job gives it."""
    command: Annotated[list[Arg], Field(min_length=1, max_length=4096)] | None = None
    """The program; unset: each job gives it (in the trainer, torchrun runs it)."""
    args: list[str] | None = None
    """Arguments appended to command."""
    resources: Resources | None = None
    """Compute resources, e.g. {limits: {nvidia.com/gpu: 8, rdma/ib: 1}}; a job's quantities
    replace these one resource name at a time."""
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=MAX_VOLUME_MOUNTS)] | None = None
    """Volumes mounted into the container; a job's mount at the same mountPath replaces one."""


_TRAINER_FIRST = Rule(
    f"size(self.containers) > 0 && self.containers[0].name == '{TRAINER}'",
    f'a runtime\'s first container is the trainer and must be named "{TRAINER}"',
    ".containers",
)


class PartialPodSpec(_Open):
    """The pods' spec, as in a Pod: init containers, sidecars, volumes, tolerations, node
    selectors, affinity, security context and the rest pass through to every pod."""

    RULES = (_TRAINER_FIRST,)

    containers: Annotated[list[PartialContainer], Field(min_length=1, max_length=MAX_CONTAINERS)]
    """The first container is the trainer, named "trainer"; torchrun runs in it."""
    volumes: Annotated[list[Volume], Field(max_length=MAX_VOLUMES)] | None = None
    """The pod's volumes; a job's volume of the same name replaces one."""

    @model_validator(mode="after")
    def _check_trainer(self) -> PartialPodSpec:
        if self.containers[0].name != TRAINER:
            raise ValueError(_TRAINER_FIRST.message)
        return self


class PartialPodTemplate(_Open):
    """The pod every node of a job runs, before the job's own template is merged onto it."""

    metadata: dict[str, Any] | None = None
    """Labels and annotations copied onto every pod; a job's keys replace these."""
    spec: PartialPodSpec
    """The pod's spec."""


class RuntimeSpec(_Wire):
    """A training runtime: a pod template and defaults that jobs naming it start from. Each
    field a job sets replaces the runtime's (objects field by field, docs/runtimes.md)."""

    template: PartialPodTemplate
    """The pod template; its first container, "trainer", runs torchrun."""
    nproc_per_node: ProcsPerNode | None = None
    """Worker processes per pod, unless the job says: an integer, or "gpu"."""
    torchrun: Torchrun | None = None
    """Options of torchrun itself, unless the job sets them."""
    rendezvous: Rendezvous | None = None
    """torchrun's c10d rendezvous, unless the job sets it."""
    failure_policy: FailurePolicy | None = None
    """Gang restarts after a failure, unless the job sets them."""
    scheduling: Scheduling | None = None
    """Gang scheduling and placement, unless the job sets them."""
