"""The DistributedTrainingJob API: pydantic models are the single source of truth.

The CRD schema (api/crd.py) is generated from these models; the shell may also validate a
job with `JobSpec.model_validate(obj["spec"])` to reject what the apiserver let through.
Wire names are camelCase; Python attributes are snake_case.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

GPU_RESOURCE = "nvidia.com/gpu"
# Bounds that keep CEL rules inside the apiserver's cost budget and the status small.
MAX_NODES = 4096
MAX_CONTAINERS = 64

# A Kubernetes quantity: an integer or a string such as "2" or "500m".
Quantity = int | str


class _Wire(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class _Open(BaseModel):
    """A Kubernetes object we only partly type; everything else is kept as given."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        frozen=True,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class Resources(_Open):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class Container(_Open):
    """The fields of a container we read; the rest of the container passes through."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    image: Annotated[str, Field(min_length=1, max_length=4096)]
    command: Annotated[
        list[Annotated[str, Field(max_length=65536)]], Field(min_length=1, max_length=4096)
    ] = Field(description="The training program, e.g. [python, train.py]. Required.")
    args: list[str] | None = None
    resources: Resources | None = None


class PodSpec(_Open):
    containers: Annotated[list[Container], Field(min_length=1, max_length=MAX_CONTAINERS)] = Field(
        description="The first container is the trainer; torchrun runs in it."
    )


class PodTemplateSpec(_Open):
    metadata: dict[str, Any] | None = None
    spec: PodSpec


class Elastic(_Wire):
    """Elastic bounds handed to torchrun as `--nnodes MIN:MAX`.

    `spec.nodes` is how many pods the operator runs; it must lie within [minNodes, maxNodes]
    (maxNodes defaults to `nodes`). With minNodes < maxNodes a lost pod (other than pod 0,
    which hosts the rendezvous store) is replaced alone while at least minNodes pods still
    run; below minNodes the whole gang restarts.
    """

    min_nodes: Annotated[int, Field(ge=1, le=MAX_NODES)]
    max_nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] | None = None


class Rendezvous(_Wire):
    port: Annotated[int, Field(ge=1, le=65535)] = 29400
    join_timeout_seconds: Annotated[int, Field(ge=1)] = 600
    dns_timeout_seconds: Annotated[int, Field(ge=1)] = 300


class Torchrun(_Wire):
    max_restarts: Annotated[int, Field(ge=0, description="torchrun's in-pod worker restarts")] = 0


class FailurePolicy(_Wire):
    """Gang restarts: every pod of the attempt is replaced, with back-off between attempts."""

    max_restarts: Annotated[int, Field(ge=0)] = 3
    backoff_seconds: Annotated[int, Field(ge=0)] = 10
    max_backoff_seconds: Annotated[int, Field(ge=0)] = 300
    retryable_exit_codes: Annotated[
        list[Annotated[int, Field(ge=-255, le=255)]], Field(max_length=256)
    ] = Field(default_factory=list)


class RunPolicy(_Wire):
    active_deadline_seconds: Annotated[int, Field(ge=1)] | None = None
    ttl_seconds_after_finished: Annotated[int, Field(ge=0)] | None = None
    clean_pod_policy: Literal["KeepFailed", "KeepAll", "Delete"] = "KeepFailed"
    suspend: bool = False
    progress_timeout_seconds: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description=(
            "Opt-in hang detection: when the step counter a training script writes to "
            "$TORCHRUN_OPERATOR_PROGRESS_FILE stays unchanged this long after rendezvous, the "
            "pod turns NotReady and the attempt fails with reason ProgressStalled "
            "(infrastructure: a gang restart within failurePolicy.maxRestarts). "
            "See docs/progress.md."
        ),
    )


class NetworkPolicy(_Wire):
    """The per-job NetworkPolicy that admits the rendezvous port only from the job's own pods."""

    enabled: bool | None = Field(
        default=None,
        description=(
            "Render a NetworkPolicy for this job. Unset: the operator's default "
            "(--network-policy, on unless the chart turns it off)."
        ),
    )


class JobSpec(_Wire):
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] = Field(
        description="Pods (one per node) the operator runs; with elastic, within its bounds."
    )
    elastic: Elastic | None = None
    nproc_per_node: int | Literal["gpu"] | None = Field(
        default=None,
        description=(
            'Worker processes per pod: an integer, or "gpu" for the trainer\'s nvidia.com/gpu '
            "limit. Unset: that GPU limit if the trainer has one, else 1."
        ),
    )
    template: PodTemplateSpec
    rendezvous: Rendezvous = Rendezvous()
    torchrun: Torchrun = Torchrun()
    success_policy: Literal["AllRanks", "RankZero"] = "AllRanks"
    failure_policy: FailurePolicy = FailurePolicy()
    run_policy: RunPolicy = RunPolicy()
    network_policy: NetworkPolicy = NetworkPolicy()

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        if isinstance(self.nproc_per_node, int) and self.nproc_per_node < 1:
            raise ValueError("nprocPerNode must be at least 1")
        if self.elastic is not None:
            hi = self.elastic.max_nodes if self.elastic.max_nodes is not None else self.nodes
            if not self.elastic.min_nodes <= self.nodes <= hi:
                raise ValueError("elastic: need minNodes <= nodes <= maxNodes")
        if self.nproc_per_node == "gpu" and trainer_gpu_limit(self) is None:
            raise ValueError(
                'nprocPerNode "gpu" needs a nvidia.com/gpu limit on the first container'
            )
        return self

    @property
    def trainer(self) -> Container:
        return self.template.spec.containers[0]

    @property
    def min_nodes(self) -> int:
        return self.elastic.min_nodes if self.elastic else self.nodes

    @property
    def max_nodes(self) -> int:
        if self.elastic and self.elastic.max_nodes is not None:
            return self.elastic.max_nodes
        return self.nodes

    @property
    def is_elastic(self) -> bool:
        return self.elastic is not None and self.min_nodes < self.max_nodes


def trainer_gpu_limit(spec: JobSpec) -> int | None:
    """The trainer's nvidia.com/gpu limit (requests as a fallback), None when absent."""
    res = spec.trainer.resources
    if res is None:
        return None
    for table in (res.limits, res.requests):
        if table and GPU_RESOURCE in table:
            return int(str(table[GPU_RESOURCE]))
    return None


# ---- status ---------------------------------------------------------------------------------

Phase = Literal["Pending", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]


class Condition(_Wire):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None


class NodeCounts(_Wire):
    desired: int = 0
    scheduled: int = 0
    running: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    summary: str | None = Field(default=None, description='"ready/desired", for kubectl get')


class RankStatus(_Wire):
    """One node rank (pod index). Null fields are left out to keep the status small."""

    node_rank: int
    pod: str | None = None
    node: str | None = None
    global_ranks: str | None = Field(default=None, description='Compact, e.g. "0-7"')
    phase: str | None = None
    ready: bool | None = None
    restarts: int | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    started_at: str | None = None
    finished_at: str | None = None


class Failure(_Wire):
    rank: int | None = None
    node_rank: int | None = None
    pod: str | None = None
    node: str | None = None
    exit_code: int | None = None
    kind: str | None = None
    reason: str | None = None
    message: str | None = None
    at: str | None = None


class RestartRecord(_Wire):
    attempt: int
    at: str
    reason: str | None = None
    rank: int | None = None
    node_rank: int | None = None
    kind: Literal["user", "infrastructure", "suspend", "replacement"] | None = None


class Counters(_Wire):
    user_failures: int = 0
    infrastructure_failures: int = 0
    restarts: int = Field(default=0, description="Recoveries spent from failurePolicy.maxRestarts.")


class JobStatus(_Wire):
    phase: Phase | None = None
    conditions: list[Condition] | None = None
    observed_generation: int | None = None
    attempt: int | None = None
    world_size: int | None = None
    nodes: NodeCounts | None = None
    ranks: list[RankStatus] | None = None
    failure: Failure | None = None
    restarts: list[RestartRecord] | None = None
    counters: Counters | None = None
    start_time: str | None = None
    completion_time: str | None = None
    last_restart_time: str | None = None
