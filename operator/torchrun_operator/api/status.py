"""The job's status (JobStatus) and its parts: conditions, pod counts, one entry per pod,
the root cause of the latest failure, avoided nodes, restarts, progress, the resolved runtime.

Apart from the spec (api/spec.py) because only the operator writes it and nothing in it is
validated against user input; the CRD's status schema and the SDK's typed reads come from it.
"""

from __future__ import annotations

from typing import Any, Literal

from .scheduling import SchedulingStatus
from .status_names import Phase, RestartKind
from .wire import _Wire


class Condition(_Wire):
    """A condition with Kubernetes semantics: lastTransitionTime moves only when status flips."""

    type: str
    """Created, Scheduled, RendezvousDone, Running, Restarting, Suspended, Blocked, Straggler,
    Admitted (jobs queued through Kueue), RuntimeResolved (jobs naming a runtime), Succeeded
    or Failed."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str | None = None
    """Why, in one CamelCase word."""
    message: str | None = None
    """Why, for people."""
    last_transition_time: str | None = None
    """When status last flipped (RFC 3339)."""


class NodeCounts(_Wire):
    """The current attempt's pods, counted."""

    desired: int = 0
    """Pods the attempt runs: spec.nodes."""
    scheduled: int = 0
    """Pods bound to a node."""
    running: int = 0
    """Pods running and not terminating."""
    ready: int = 0
    """Pods ready: their node joined the rendezvous and trains."""
    succeeded: int = 0
    """Pods that exited 0."""
    failed: int = 0
    """Pods that failed or were lost."""
    summary: str | None = None
    """Ready pods / desired pods, e.g. "3/4", for kubectl get."""


class RankStatus(_Wire):
    """One pod of the current attempt, by its index. Null fields are left out to keep the
    status small."""

    index: int
    """The pod's index in the job, 0..nodes-1: its pod is <job>-<index> (-a<attempt> after
    attempt 0) with label torchrun.dev/index. Fixed when the pod is created; not torchrun's
    node rank."""
    pod: str | None = None
    """The pod's name."""
    node: str | None = None
    """The Kubernetes node the pod runs on."""
    node_rank: int | None = None
    """torchrun's node rank (GROUP_RANK) of the pod in its latest rendezvous round, as its
    launcher reports it: live while the pod runs, then in its final report. c10d orders nodes
    by address, so it need not equal index."""
    global_ranks: str | None = None
    """The pod's global ranks, compact, e.g. "0-7"; reported by the launcher."""
    round: int | None = None
    """The c10d rendezvous round nodeRank and globalRanks come from (0 first; torchrun's in-pod
    restarts and elastic membership changes start new rounds)."""
    phase: str | None = None
    """The pod's phase; Creating before it exists, Terminating while it is deleted."""
    ready: bool | None = None
    """Whether the pod is ready (its node joined the rendezvous)."""
    restarts: int | None = None
    """torchrun's in-pod worker restarts so far."""
    exit_code: int | None = None
    """The trainer's exit code once it ended."""
    reason: str | None = None
    """Why the pod is not running or succeeded, in one word."""
    message: str | None = None
    """The pod's first error, truncated."""
    started_at: str | None = None
    """When the trainer started (RFC 3339)."""
    finished_at: str | None = None
    """When the trainer ended (RFC 3339)."""
    failure_observed_at: str | None = None
    """When the operator first saw this pod fail, by its own clock. Times the pod's node
    reports are clamped to a few seconds before this, so a node clock that is off cannot
    change the root cause or when the failure is handled."""
    running_observed_at: str | None = None
    """When the operator first saw this pod Running, by its own clock. The rendezvous hang
    timer and a stuck launcher's join timeout count from it, and a pod first seen Running
    after the rendezvous completed (an elastic replacement) is not judged by progress: a
    node clock that is off changes neither (docs/progress.md)."""
    not_ready_observed_at: str | None = None
    """While the pod is Running and not Ready: when the operator first saw it so since it was
    last Ready, by its own clock. runPolicy.progressTimeoutSeconds stalls count from it."""
    step: int | None = None
    """The last training step the pod's script wrote to $TORCHRUN_OPERATOR_PROGRESS_FILE."""
    steps_per_second: float | None = None
    """Steps per second over the launcher's window (docs/progress.md)."""
    step_seconds: float | None = None
    """Mean seconds per step over the window: the script's own stepTime when it reports one,
    else the time between steps. The Straggler condition compares it across pods."""
    last_step_at: str | None = None
    """When the step last changed (RFC 3339, the pod's clock)."""


class Failure(_Wire):
    """The root cause of the latest failure: the first error across all nodes."""

    rank: int | None = None
    """The global rank that failed first, if known."""
    index: int | None = None
    """The index of the pod it ran in (status.ranks[].index)."""
    node_rank: int | None = None
    """torchrun's node rank of that pod, if known."""
    pod: str | None = None
    """That pod's name."""
    node: str | None = None
    """The Kubernetes node the pod ran on."""
    exit_code: int | None = None
    """The exit code, if the process exited."""
    kind: str | None = None
    """What failed (docs/failures.md): what the error says, cuda-oom, gpu-device,
    nccl-timeout, gloo-timeout or nccl-comm, else how the rank or pod ended: exception,
    signal, comm, exit, rendezvous, launcher, oom (the kernel's OOM killer), evicted, lost or
    stalled."""
    reason: str | None = None
    """The reason, in one word."""
    message: str | None = None
    """The error, truncated (e.g. the exception and its message)."""
    at: str | None = None
    """When it happened (RFC 3339)."""
    step: int | None = None
    """The last step the attempt reached (the highest any pod reported), if reported."""
    location: str | None = None
    """Where (file:line in function): for an exception, the frame of the user's code that
    raised it (from the traceback the worker recorded); for a hang, where the rank that is not
    inside a collective is; the full stacks are in the pod's log."""


class AvoidedNode(_Wire):
    """A node the job's next pods keep off (required node affinity), after a failure that was
    the node's (docs/failures.md)."""

    node: str
    """The node's name."""
    reason: str
    """Why, in one word (GPUDeviceError, NodeLost, DeletionByTaintManager, Evicted...)."""
    since: str
    """When the operator decided it (RFC 3339)."""
    until: str
    """Until when (RFC 3339); later pods may run there again."""
    kind: str | None = None
    """The failure's kind (status.failure.kind)."""
    index: int | None = None
    """The index of the pod that failed there."""


class RestartRecord(_Wire):
    """One restart, resume or elastic replacement."""

    attempt: int
    """The attempt that started with it."""
    at: str
    """When (RFC 3339)."""
    reason: str | None = None
    """Why, in one word."""
    rank: int | None = None
    """The global rank whose failure caused it, if known."""
    index: int | None = None
    """The index of the pod that failed, if any."""
    node_rank: int | None = None
    """torchrun's node rank of the pod that failed, if known."""
    kind: RestartKind | None = None
    """What caused it: the program (user), the pods or nodes (infrastructure), a resume or a
    spec changed under the running attempt (suspend), or an elastic pod replacement."""
    step: int | None = None
    """The last step the failed attempt reached (the highest any pod reported), if reported."""
    signature: str | None = None
    """The failure's root cause with rank, numbers and addresses masked (a hang: the rank
    outside any collective and its frame, else the pod index and node that went quiet first):
    two attempts that failed alike have equal signatures (failurePolicy.crashLoopDetection)."""


class LastCheckpoint(_Wire):
    """The latest checkpoint a pod's script reported through its progress file."""

    step: int
    """The training step the checkpoint holds."""
    path: str
    """Where the script saved it (as the script wrote it, at most 1024 characters); the next
    attempt's pods get it in TORCHRUN_OPERATOR_RESUME_FROM."""
    time: str | None = None
    """When the operator first saw it (RFC 3339)."""


class JobProgress(_Wire):
    """The job's training progress, from its pods' progress files (docs/progress.md)."""

    step: int
    """The lowest last step of the pods that report one: every pod got at least this far."""
    total_steps: int | None = None
    """The step count the script declared (a second number in the progress file)."""
    steps_per_second: float | None = None
    """The median of the pods' steps per second."""
    eta: str | None = None
    """When training reaches totalSteps at that rate (RFC 3339)."""
    start_step: int | None = None
    """The first step the operator saw of this attempt (the lowest any pod reported then):
    where it resumed, give or take a read. Crash-loop detection judges the attempt's
    progress from it (docs/progress.md)."""


class Counters(_Wire):
    """Failures and recoveries over the job's life."""

    user_failures: int = 0
    """Failures of the training program (not restarted)."""
    infrastructure_failures: int = 0
    """Failures of pods or nodes, and retryable exit codes."""
    restarts: int = 0
    """Recoveries spent from failurePolicy.maxRestarts."""


class RuntimeStatus(_Wire):
    """The runtime the job resolved when it started (spec.runtimeRef), recorded before any of
    its pods was created. The job's pods, and those of every later attempt, are rendered from
    spec merged onto this record's spec, never from the runtime as it is now."""

    kind: str
    """ClusterDistributedTrainingRuntime or DistributedTrainingRuntime."""
    name: str
    """The runtime's name."""
    uid: str | None = None
    """The runtime object's uid when it was resolved."""
    resource_version: str | None = None
    """Its resourceVersion when it was resolved."""
    spec_hash: str | None = None
    """A hash (sha256, hex, first 16 digits) of the merged spec when it was resolved."""
    spec: dict[str, Any]
    """The runtime's spec as it was resolved: what the job's spec is merged onto."""


class JobStatus(_Wire):
    """What the operator observed; written by the operator only."""

    phase: Phase | None = None
    """Pending, Queued (waiting for Kueue to admit it; the Admitted condition says why),
    Starting, Waiting (pods the scheduler cannot place yet: the Scheduled condition says why),
    Running, Restarting, Succeeded, Failed or Suspended."""
    conditions: list[Condition] | None = None
    """The job's conditions."""
    observed_generation: int | None = None
    """The metadata.generation this status was computed from."""
    attempt: int | None = None
    """The gang attempt, from 0; each gang restart or resume starts the next."""
    attempt_spec_hash: str | None = None
    """A hash of the spec fields the current attempt's pods are rendered from (the template,
    nodes or the elastic bounds, nprocPerNode, rendezvous, torchrun, scheduling and
    checkpoint), recorded when the attempt starts. A spec that hashes otherwise while the
    attempt's pods run starts the next attempt (restart reason SpecChanged): no attempt mixes
    pods of two specs."""
    world_size: int | None = None
    """Ranks when all spec.nodes pods take part: nodes times processes per pod."""
    nodes: NodeCounts | None = None
    """The current attempt's pods, counted."""
    ranks: list[RankStatus] | None = None
    """One entry per pod (index) of the current attempt."""
    progress: JobProgress | None = None
    """Training progress of the current attempt, when the pods report it."""
    failure: Failure | None = None
    """The root cause of the latest failure."""
    avoided_nodes: list[AvoidedNode] | None = None
    """Nodes the job's pods keep off for a while after a failure that was the node's (a GPU
    device error, a lost node, an eviction for node pressure), at most a few, newest last;
    cleared when the job ends (docs/failures.md)."""
    restarts: list[RestartRecord] | None = None
    """The latest restarts, oldest first."""
    counters: Counters | None = None
    """Failures and restarts over the job's life."""
    start_time: str | None = None
    """When the job started pods (RFC 3339); a resume clears it. The deadline counts from it."""
    completion_time: str | None = None
    """When the job succeeded or failed (RFC 3339)."""
    last_restart_time: str | None = None
    """When the latest gang restart was decided (RFC 3339); back-off counts from it."""
    scheduling: SchedulingStatus | None = None
    """The current attempt's gang objects (spec.scheduling.gang); absent without a gang."""
    runtime: RuntimeStatus | None = None
    """The runtime spec.runtimeRef resolved to, recorded once when the job started."""
    last_checkpoint: LastCheckpoint | None = None
    """The latest checkpoint the job's pods reported (the highest step), kept across attempts:
    every restart, replacement and resume starts from it (docs/progress.md)."""
