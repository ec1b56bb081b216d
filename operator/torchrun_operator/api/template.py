"""The job's pod template: the Kubernetes objects (resources, containers, volumes, the pod
spec) the API types only in part, with the checks on them: whole GPUs, the operator's reserved
volume names and mount paths, and no operator-owned flag to a launcher in the trainer's command.

Apart from the job's spec (api/spec.py) because runtimes (api/runtime.py) build on these too,
and the renderer reads them; everything else a pod spec holds passes through untyped (_Open).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from .bounds import (
    GPU_RESOURCE,
    MAX_CONTAINERS,
    MAX_PATH_LENGTH,
    MAX_VOLUME_MOUNTS,
    MAX_VOLUMES,
    RESERVED_MOUNT_PATHS,
    RESERVED_VOLUME_PREFIX,
    Quantity,
    gpu_count,
    reserved_path,
)
from .celrules import (
    LAUNCHER_FLAG_AS_VALUE,
    LAUNCHER_OWNED_FLAGS,
    RESERVED_PATHS_CEL,
    cel_gpu_count_ok,
    cel_gpu_rule,
    cel_same_gpu_count,
)
from .wire import Rule, _Open

_GPU_LIMIT_FORMAT = cel_gpu_rule("limits")
_GPU_REQUEST_FORMAT = cel_gpu_rule("requests")
_REQ, _LIM = (f"self.{t}['{GPU_RESOURCE}']" for t in ("requests", "limits"))
_GPU_REQUEST_NEEDS_LIMIT = Rule(
    # A malformed request is the format rule's to report.
    f"!has(self.requests) || !('{GPU_RESOURCE}' in self.requests) || "
    f"!{cel_gpu_count_ok(_REQ)} || (has(self.limits) && '{GPU_RESOURCE}' in self.limits && "
    f"{cel_same_gpu_count(_REQ, _LIM)})",
    f"a {GPU_RESOURCE} request needs an equal {GPU_RESOURCE} limit (Kubernetes requires it "
    "of GPUs; a limit alone is enough)",
    ".requests",
)


class Resources(_Open):
    """The container's compute resources, as in a Pod."""

    RULES = (_GPU_LIMIT_FORMAT, _GPU_REQUEST_FORMAT, _GPU_REQUEST_NEEDS_LIMIT)

    limits: dict[str, Quantity] | None = None
    """Most of each resource the container may use, e.g. {nvidia.com/gpu: 8, memory: 64Gi}."""
    requests: dict[str, Quantity] | None = None
    """What the scheduler reserves for the container; for nvidia.com/gpu equal to the limit."""

    @model_validator(mode="after")
    def _check_gpus(self) -> Resources:
        for table, rule in ((self.limits, _GPU_LIMIT_FORMAT), (self.requests, _GPU_REQUEST_FORMAT)):
            if table and GPU_RESOURCE in table and gpu_count(table[GPU_RESOURCE]) is None:
                raise ValueError(rule.message)
        if self.requests and GPU_RESOURCE in self.requests:
            limit = (self.limits or {}).get(GPU_RESOURCE)
            if limit is None or gpu_count(limit) != gpu_count(self.requests[GPU_RESOURCE]):
                raise ValueError(_GPU_REQUEST_NEEDS_LIMIT.message)
        return self


# ---- pod template ---------------------------------------------------------------------------


class VolumeMount(_Open):
    """A volume mounted into the container, as in a Pod."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    """The volume's name in the pod's volumes."""
    mount_path: Annotated[str, Field(min_length=1, max_length=MAX_PATH_LENGTH)]
    """Where the volume appears in the container."""


class Container(_Open):
    """The fields of a container we read; the rest of the container passes through."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    """The container's name, unique in the pod."""
    image: Annotated[str, Field(min_length=1, max_length=4096)]
    """The container image."""
    command: Annotated[
        list[Annotated[str, Field(max_length=65536)]], Field(min_length=1, max_length=4096)
    ]
    """The training program, e.g. [python, train.py]; in the trainer torchrun runs it. Required.
    A trainer command that starts with torchrun, python -m torch.distributed.run or python -m
    torch.distributed.launch is unwrapped: the script runs under the operator's torchrun, and
    flags that set what the spec sets are refused (docs/migrating.md)."""
    args: list[str] | None = None
    """Arguments appended to command."""
    resources: Resources | None = None
    """Compute resources; the trainer's nvidia.com/gpu limit can set nprocPerNode."""
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=MAX_VOLUME_MOUNTS)] | None = None
    """Volumes mounted into the container; the trainer may not use the operator's paths."""


_RESERVED_VOLUME = Rule(
    f"!self.name.startsWith('{RESERVED_VOLUME_PREFIX}')",
    f'volume names starting with "{RESERVED_VOLUME_PREFIX}" are reserved for the '
    "operator's own volumes",
    ".name",
)


class Volume(_Open):
    """A volume of the pod, as in a Pod; only its name is checked here."""

    RULES = (_RESERVED_VOLUME,)

    name: Annotated[str, Field(min_length=1, max_length=63)]
    """The volume's name, unique in the pod; names starting with "torchrun-" are reserved."""

    @model_validator(mode="after")
    def _check_name(self) -> Volume:
        if self.name.startswith(RESERVED_VOLUME_PREFIX):
            raise ValueError(_RESERVED_VOLUME.message)
        return self


_RESERVED_MOUNT = Rule(
    # An empty list is minItems' to report; containers[0] of it would be a CEL error. A job
    # with a runtime may give no containers (they come from the runtime).
    "!has(self.containers) || size(self.containers) == 0 || "
    "!has(self.containers[0].volumeMounts) || "
    "self.containers[0].volumeMounts.all(m, "
    f"!{RESERVED_PATHS_CEL}.exists(p, m.mountPath == p || m.mountPath.startsWith(p + '/')))",
    "the trainer (first container) may not mount anything at or under "
    f"{', '.join(RESERVED_MOUNT_PATHS)}: the operator puts its launcher, its state and the "
    "termination message there",
    ".containers",
)


class PodSpec(_Open):
    """The pods' spec, as in a Pod; the operator adds torchrun to the first container."""

    RULES = (_RESERVED_MOUNT, LAUNCHER_OWNED_FLAGS, LAUNCHER_FLAG_AS_VALUE)

    containers: Annotated[list[Container], Field(min_length=1, max_length=MAX_CONTAINERS)]
    """The first container is the trainer; torchrun runs in it."""
    volumes: Annotated[list[Volume], Field(max_length=MAX_VOLUMES)] | None = None
    """The pod's volumes; the operator adds its own, named "torchrun-*"."""

    @model_validator(mode="after")
    def _check_trainer_mounts(self) -> PodSpec:
        mounts = self.containers[0].volume_mounts or []
        if any(reserved_path(m.mount_path) for m in mounts):
            raise ValueError(_RESERVED_MOUNT.message)
        return self


class PodTemplateSpec(_Open):
    """The pod every node runs, as in a Deployment's template."""

    metadata: dict[str, Any] | None = None
    """Labels and annotations copied onto every pod."""
    spec: PodSpec
    """The pod's spec."""
