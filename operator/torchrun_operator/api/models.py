"""The DistributedTrainingJob API: pydantic models are the single source of truth.

The CRD schema (api/crd.py) is generated from these models: field docstrings become the
descriptions `kubectl explain` shows, and each model's CEL rules (`RULES`) sit next to the
Python check that refuses the same input. The apiserver so refuses a bad job at `kubectl
apply`; whatever reaches the reconciler anyway (a CRD installed without the rules, an
apiserver too old for them) fails `JobSpec.model_validate` there and the job turns Failed with
reason InvalidSpec. Transition rules (they compare with `oldSelf`) are CEL only: the
reconciler never sees the previous spec. docs/bad-input.md lists the refusals.
Wire names are camelCase; Python attributes are snake_case.

The models live in modules by concern: api/bounds.py (limits and reserved names),
api/template.py (the pod template), api/spec.py (JobSpec), api/status.py (JobStatus),
api/scheduling.py (spec.scheduling) and api/celrules.py (the CEL-only rules). This module
names them all in one place, so that `from torchrun_operator.api.models import X` keeps working.
"""

from __future__ import annotations

from .bounds import (
    GPU_RESOURCE,
    MAX_CHECKPOINT_PATH,
    MAX_CONTAINERS,
    MAX_DURATION_SECONDS,
    MAX_GPUS_PER_POD,
    MAX_NODES,
    MAX_PATH_LENGTH,
    MAX_PROCS_PER_NODE,
    MAX_RESTARTS,
    MAX_TIMEOUT_SECONDS,
    MAX_VOLUME_MOUNTS,
    MAX_VOLUMES,
    RESERVED_MOUNT_PATHS,
    RESERVED_VOLUME_PREFIX,
    Quantity,
    gpu_count,
)
from .scheduling import (
    Scheduling,
    SchedulingStatus,
)
from .spec import (
    RUNTIME_KINDS,
    Checkpoint,
    Elastic,
    FailurePolicy,
    JobSpec,
    Monitoring,
    NetworkPolicy,
    ProcsPerNode,
    Rendezvous,
    RunPolicy,
    RuntimeRef,
    Straggler,
    Torchrun,
    trainer_gpu_limit,
)
from .status import (
    AvoidedNode,
    Condition,
    Counters,
    Failure,
    JobProgress,
    JobStatus,
    LastCheckpoint,
    NodeCounts,
    RankStatus,
    RestartRecord,
    RuntimeStatus,
)
from .template import (
    Container,
    PodSpec,
    PodTemplateSpec,
    Resources,
    Volume,
    VolumeMount,
)

__all__ = [
    "GPU_RESOURCE",
    "MAX_CHECKPOINT_PATH",
    "MAX_CONTAINERS",
    "MAX_DURATION_SECONDS",
    "MAX_GPUS_PER_POD",
    "MAX_NODES",
    "MAX_PATH_LENGTH",
    "MAX_PROCS_PER_NODE",
    "MAX_RESTARTS",
    "MAX_TIMEOUT_SECONDS",
    "MAX_VOLUME_MOUNTS",
    "MAX_VOLUMES",
    "RESERVED_MOUNT_PATHS",
    "RESERVED_VOLUME_PREFIX",
    "Quantity",
    "gpu_count",
    "Container",
    "PodSpec",
    "PodTemplateSpec",
    "Resources",
    "Volume",
    "VolumeMount",
    "RUNTIME_KINDS",
    "Checkpoint",
    "Elastic",
    "FailurePolicy",
    "JobSpec",
    "Monitoring",
    "NetworkPolicy",
    "ProcsPerNode",
    "Rendezvous",
    "RunPolicy",
    "RuntimeRef",
    "Straggler",
    "Torchrun",
    "trainer_gpu_limit",
    "AvoidedNode",
    "Condition",
    "Counters",
    "Failure",
    "JobProgress",
    "JobStatus",
    "LastCheckpoint",
    "NodeCounts",
    "RankStatus",
    "RestartRecord",
    "RuntimeStatus",
    "Scheduling",
    "SchedulingStatus",
]
