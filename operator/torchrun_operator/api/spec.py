"""The job's spec (JobSpec) and its parts: elastic bounds, rendezvous, torchrun's options,
the failure, run, monitoring, checkpoint and network policies, and the runtime reference.

Apart from the pod template (api/template.py), which runtimes share, and from the status
(api/status.py), which only the operator writes. Each model's CEL rules sit next to the Python
check that refuses the same input; the CEL-only rules are api/celrules.py's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ..launcher import contract
from . import launchcmd
from .bounds import (
    GPU_RESOURCE,
    MAX_DURATION_SECONDS,
    MAX_NODES,
    MAX_PATH_LENGTH,
    MAX_PROCS_PER_NODE,
    MAX_RESTARTS,
    MAX_TIMEOUT_SECONDS,
    RESERVED_MOUNT_PATHS,
    gpu_count,
    reserved_path,
)
from .celrules import JOB_TRANSITIONS, RESERVED_PATHS_CEL
from .scheduling import Scheduling
from .template import Container, PodTemplateSpec
from .wire import Rule, _Wire


class Elastic(_Wire):
    """Elastic bounds handed to torchrun as `--nnodes MIN:MAX`.

    `spec.nodes` is how many pods the operator runs; it must lie within [minNodes, maxNodes]
    (maxNodes defaults to `nodes`). With minNodes < maxNodes a lost pod (other than pod 0,
    which hosts the rendezvous store) is replaced alone while at least minNodes pods still
    run; below minNodes the whole gang restarts.
    """

    min_nodes: Annotated[int, Field(ge=1, le=MAX_NODES)]
    """Fewest pods training goes on with."""
    max_nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] | None = None
    """Most pods; unset: nodes. Set it to change nodes without suspending the job."""


_STATUS_PORT_RESERVED = Rule(
    f"!has(self.port) || self.port != {contract.STATUS_PORT}",
    f"rendezvous.port {contract.STATUS_PORT} is the launcher's status port in every training pod "
    "(docs/pod-contract.md); choose another",
    ".port",
)


class Rendezvous(_Wire):
    """torchrun's c10d rendezvous, hosted by pod 0."""

    RULES = (_STATUS_PORT_RESERVED,)

    port: Annotated[int, Field(ge=1, le=65535)] = 29400
    """The c10d store's TCP port on pod 0 (not 29401, the launcher's status port)."""
    join_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] = 600
    """How long a pod waits for the others to join (torchrun's join_timeout)."""
    dns_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] = 300
    """How long a pod other than pod 0 waits, before starting torchrun, for pod 0's host name
    to resolve and for the rendezvous store to answer at an address the name gives (pod 0
    reaches the store it hosts over loopback)."""

    @model_validator(mode="after")
    def _check_port(self) -> Rendezvous:
        if self.port == contract.STATUS_PORT:
            raise ValueError(_STATUS_PORT_RESERVED.message)
        return self


class Torchrun(_Wire):
    """Options of the torchrun in every pod."""

    max_restarts: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = 0
    """torchrun's in-pod worker restarts (--max-restarts), before the pod fails."""
    local_rank_arg: Literal["--local-rank", "--local_rank"] | None = None
    """Pass each worker's script its local rank as an argument, --local-rank=<N> (or
    --local_rank=<N>, as torch before 2.0 spelled it), right after the script, as
    torch.distributed.launch did: for launch-era scripts whose argparse requires it. Unset: no
    such argument, unless the trainer's command is python -m torch.distributed.launch without
    --use-env, which implies --local-rank. Every worker has the LOCAL_RANK environment
    variable either way, which scripts may read instead. See docs/migrating.md."""


class FailurePolicy(_Wire):
    """Gang restarts: every pod of the attempt is replaced, with back-off between attempts."""

    max_restarts: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = 3
    """Gang restarts (and elastic replacements) before the job fails."""
    backoff_seconds: Annotated[int, Field(ge=0, le=MAX_TIMEOUT_SECONDS)] = 10
    """Wait before the first restart; it doubles with each restart after."""
    max_backoff_seconds: Annotated[int, Field(ge=0, le=MAX_TIMEOUT_SECONDS)] = 300
    """The longest wait between restarts."""
    retryable_exit_codes: Annotated[
        list[Annotated[int, Field(ge=-255, le=255)]], Field(max_length=256)
    ] = Field(default_factory=list)
    """Exit codes of the training program that count as infrastructure failures (restarted);
    any other failure of the program fails the job."""
    crash_loop_detection: bool = True
    """Fail the job (reason CrashLoopNoProgress) instead of restarting it when an attempt fails
    with the same root cause as the attempt before it (exception type and message with numbers
    and addresses masked, whatever the rank; for a hang, where it hangs) and made no progress:
    it failed at that attempt's last step, or no further and without getting past the step it
    started at ($TORCHRUN_OPERATOR_PROGRESS_FILE, docs/progress.md). Restarts that made
    progress go on as before."""


class RunPolicy(_Wire):
    """When the job runs, and what is kept once it finished."""

    active_deadline_seconds: Annotated[int, Field(ge=1, le=MAX_DURATION_SECONDS)] | None = None
    """Fail the job (DeadlineExceeded) this long after it started; a resume starts it anew."""
    ttl_seconds_after_finished: Annotated[int, Field(ge=0, le=MAX_DURATION_SECONDS)] | None = None
    """Delete the job this long after it finished; unset: keep it."""
    clean_pod_policy: Literal["KeepFailed", "KeepAll", "Delete"] = "KeepFailed"
    """Which pods stay once the job finished: failed ones, all, or none."""
    suspend: bool = False
    """Delete the pods and wait; false again starts a fresh attempt. While suspended, or in
    the write that suspends or resumes, nodes, nprocPerNode, elastic, template and
    rendezvous may change (as Kueue does)."""
    progress_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] | None = None
    """Opt-in hang detection: when the step counter a training script writes to
    $TORCHRUN_OPERATOR_PROGRESS_FILE stays unchanged this long after rendezvous, the pod turns
    NotReady and the attempt fails with reason ProgressStalled (infrastructure: a gang restart
    within failurePolicy.maxRestarts). See docs/progress.md."""


class Straggler(_Wire):
    """Thresholds of the Straggler condition (docs/progress.md)."""

    factor: Annotated[float, Field(ge=1.1, le=100)] = 2.0
    """A pod is a straggler while its mean step time over the window exceeds this many times
    the median of the job's pods."""
    window_seconds: Annotated[int, Field(ge=5, le=MAX_TIMEOUT_SECONDS)] = 60
    """The window the launcher averages each pod's step time over; a pod is judged only once
    it has reported steps for this long."""


class Monitoring(_Wire):
    """Opt-in judgements on the live progress the launchers report (docs/progress.md)."""

    straggler: Straggler | None = None
    """Set (e.g. {}) to get a Straggler condition naming the pods, node ranks and global ranks
    whose step time stays above factor times the median. Unset: no such condition."""


_CHECKPOINT_ONE_SOURCE = Rule(
    "has(self.claimName) != has(self.volume)",
    "checkpoint: give exactly one of claimName (a PersistentVolumeClaim) or volume (a volume "
    "source, as in a Pod: nfs, hostPath, csi, ...)",
)
_CHECKPOINT_MOUNT_RESERVED = Rule(
    f"!{RESERVED_PATHS_CEL}.exists(p, self.mountPath == p || self.mountPath.startsWith(p + '/'))",
    "checkpoint.mountPath may not be at or under "
    f"{', '.join(RESERVED_MOUNT_PATHS)}: the operator puts its launcher, its state and the "
    "termination message there",
    ".mountPath",
)


class Checkpoint(_Wire):
    """Storage for checkpoints, mounted at the same path in every pod of every attempt
    (docs/progress.md, "Checkpoints"). The trainer gets TORCHRUN_OPERATOR_CHECKPOINT_DIR (the
    mount path) and, once a script reported a checkpoint, TORCHRUN_OPERATOR_RESUME_FROM."""

    RULES = (_CHECKPOINT_ONE_SOURCE, _CHECKPOINT_MOUNT_RESERVED)

    claim_name: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    """A PersistentVolumeClaim every pod mounts (ReadWriteMany for pods on several nodes)."""
    volume: dict[str, Any] | None = None
    """Or a volume source, as in a Pod's volumes without the name (e.g. {nfs: {server: s,
    path: /ckpt}}); it must be the same storage on every node."""
    mount_path: Annotated[str, Field(min_length=1, max_length=MAX_PATH_LENGTH)] = "/checkpoints"
    """Where the trainer sees it: TORCHRUN_OPERATOR_CHECKPOINT_DIR."""

    @model_validator(mode="after")
    def _check(self) -> Checkpoint:
        if (self.claim_name is None) == (self.volume is None):
            raise ValueError(_CHECKPOINT_ONE_SOURCE.message)
        if reserved_path(self.mount_path):
            raise ValueError(_CHECKPOINT_MOUNT_RESERVED.message)
        return self


class NetworkPolicy(_Wire):
    """The per-job NetworkPolicy that admits the job's pods only from the job's own pods (and
    the launcher's status port from the operator)."""

    enabled: bool | None = None
    """Render a NetworkPolicy for this job. Unset: the operator's default (--network-policy, on
    unless the chart turns it off)."""


ProcsPerNode = Annotated[int, Field(ge=1, le=MAX_PROCS_PER_NODE)] | Literal["gpu"]

_TRAINER = "self.template.spec.containers[0]"
_NPROC_IN_RANGE = Rule(
    "!has(self.nprocPerNode) || (type(self.nprocPerNode) == int ? "
    f"(self.nprocPerNode >= 1 && self.nprocPerNode <= {MAX_PROCS_PER_NODE}) : "
    "self.nprocPerNode == 'gpu')",
    f'nprocPerNode must be an integer from 1 to {MAX_PROCS_PER_NODE}, or "gpu"',
    ".nprocPerNode",
)
_ELASTIC_BOUNDS = Rule(
    "!has(self.elastic) || (self.elastic.minNodes <= self.nodes && "
    "(!has(self.elastic.maxNodes) || self.nodes <= self.elastic.maxNodes))",
    "elastic: need minNodes <= nodes <= maxNodes",
    ".elastic",
)
_GPU_PROCS_NEED_LIMIT = Rule(
    # With a runtime the trainer's limit may come from it: the merged spec is checked then.
    "has(self.runtimeRef) || !has(self.template) || !has(self.template.spec) || "
    "!has(self.template.spec.containers) || size(self.template.spec.containers) == 0 || "
    "!has(self.nprocPerNode) || type(self.nprocPerNode) != string || "
    "self.nprocPerNode != 'gpu' || "
    f"(has({_TRAINER}.resources) && has({_TRAINER}.resources.limits) && "
    f"'{GPU_RESOURCE}' in {_TRAINER}.resources.limits && "
    f"{_TRAINER}.resources.limits['{GPU_RESOURCE}'] != 0 && "
    f"{_TRAINER}.resources.limits['{GPU_RESOURCE}'] != '0')",
    f'nprocPerNode "gpu" needs a {GPU_RESOURCE} limit of at least 1 on the first container '
    "(the trainer)",
    ".nprocPerNode",
)

# A job without a runtime gives its whole pod template; with one, what it gives is merged onto
# the runtime's (docs/runtimes.md). The CRD leaves template, containers, image and command
# optional for that (api/crd.py); this rule asks for them back on a job without a runtime. In
# Python the model requires them of every spec: the reconciler sees only merged specs.
_TEMPLATE_UNLESS_RUNTIME = Rule(
    "has(self.runtimeRef) || (has(self.template) && has(self.template.spec) && "
    "has(self.template.spec.containers) && "
    "self.template.spec.containers.all(c, has(c.image) && has(c.command)))",
    "a job without runtimeRef needs template.spec.containers, each with an image and a command",
    ".template",
)
RUNTIME_KINDS = ("ClusterDistributedTrainingRuntime", "DistributedTrainingRuntime")


class RuntimeRef(_Wire):
    """The training runtime a job's spec is merged onto (docs/runtimes.md)."""

    kind: Literal["ClusterDistributedTrainingRuntime", "DistributedTrainingRuntime"] = (
        "ClusterDistributedTrainingRuntime"
    )
    """ClusterDistributedTrainingRuntime (cluster-wide, the default) or
    DistributedTrainingRuntime (in the job's namespace)."""
    name: Annotated[
        str,
        Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
    ]
    """The runtime's name."""


class JobSpec(_Wire):
    """A distributed PyTorch training job: `nodes` pods run torchrun against a c10d rendezvous."""

    RULES = (
        _ELASTIC_BOUNDS,
        _NPROC_IN_RANGE,
        _GPU_PROCS_NEED_LIMIT,
        _TEMPLATE_UNLESS_RUNTIME,
        *JOB_TRANSITIONS,
    )

    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)]
    """Pods (one per node) the operator runs; with elastic, within its bounds."""
    elastic: Elastic | None = None
    """Elastic training: torchrun goes on with fewer pods than nodes. Unset: a fixed gang."""
    nproc_per_node: ProcsPerNode | None = None
    """Worker processes per pod: an integer, or "gpu" for the trainer's nvidia.com/gpu limit.
    Unset: that GPU limit if the trainer has one of at least 1, else 1."""
    template: PodTemplateSpec
    """The pod every node runs; its first container is the trainer."""
    rendezvous: Rendezvous = Rendezvous()
    """torchrun's c10d rendezvous."""
    torchrun: Torchrun = Torchrun()
    """Options of torchrun itself."""
    success_policy: Literal["AllRanks", "RankZero"] = "AllRanks"
    """When the job succeeded: every pod exited 0, or the pod holding global rank 0 did."""
    failure_policy: FailurePolicy = FailurePolicy()
    """Gang restarts after a failure."""
    run_policy: RunPolicy = RunPolicy()
    """Deadline, suspension, clean-up and hang detection."""
    network_policy: NetworkPolicy = NetworkPolicy()
    """The job's NetworkPolicy."""
    monitoring: Monitoring = Monitoring()
    """Conditions derived from live training progress (Straggler)."""
    scheduling: Scheduling = Scheduling()
    """Gang scheduling (all pods of an attempt or none) and topology placement
    (docs/scheduling.md)."""
    runtime_ref: RuntimeRef | None = None
    """A training runtime this spec is merged onto when the job starts: the runtime gives the
    pod template and defaults for nprocPerNode, torchrun, rendezvous, failurePolicy and
    scheduling; the job gives what differs (docs/runtimes.md). Then template, and the image
    and command of its containers, may be left out. It cannot change, and editing the runtime
    later changes nothing in the job (status.runtime records what it resolved to)."""
    checkpoint: Checkpoint | None = None
    """Shared checkpoint storage and the resume contract (docs/progress.md, "Checkpoints").
    Unset: none. Changed while pods run, it starts the next attempt (restart reason
    SpecChanged), as the template does."""

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        if self.elastic is not None:
            hi = self.elastic.max_nodes if self.elastic.max_nodes is not None else self.nodes
            if not self.elastic.min_nodes <= self.nodes <= hi:
                raise ValueError(_ELASTIC_BOUNDS.message)
        if self.nproc_per_node == "gpu" and not trainer_gpu_limit(self):
            raise ValueError(_GPU_PROCS_NEED_LIMIT.message)
        # A launcher in the trainer's command: its flags must not set what the spec sets.
        # This is celrules.LAUNCHER_OWNED_FLAGS, and more than CEL can check.
        gpus = trainer_gpu_limit(self)
        nproc = self.nproc_per_node if isinstance(self.nproc_per_node, int) else (gpus or 1)
        problem = launchcmd.check([*self.trainer.command, *(self.trainer.args or [])], nproc, gpus)
        if problem is not None:
            raise ValueError(problem)
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
    """The trainer's nvidia.com/gpu limit, None when absent. A GPU request always has an equal
    limit (validated), so the limit is the whole story."""
    res = spec.trainer.resources
    if res is None or not res.limits or GPU_RESOURCE not in res.limits:
        return None
    return gpu_count(res.limits[GPU_RESOURCE])
