"""The words a job's status is made of: phases, condition types, reasons and restart kinds.

One home for each: the reconciler writes them, the metrics, kubectl-dtj and the tests read
them, and the CRD's schema (api/status.py) takes its phase and restart-kind enums from here.
They are `StrEnum`s, so a member is the very string the status holds (`Phase.RUNNING ==
"Running"`) and goes into JSON and the API unchanged.
"""

from __future__ import annotations

from enum import StrEnum

from ..launcher import contract

__all__ = [
    "FINISHED",
    "ConditionType",
    "Phase",
    "PodPhase",
    "RankPhase",
    "Reason",
    "RestartKind",
]


class Phase(StrEnum):
    """status.phase (docs/design.md, "Phases")."""

    PENDING = "Pending"
    QUEUED = "Queued"  # waiting for Kueue to admit its Workload
    STARTING = "Starting"
    WAITING = "Waiting"  # pods the scheduler cannot place yet (Scheduled condition)
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


# Phases a job never leaves (only its TTL deletes it).
FINISHED = (Phase.SUCCEEDED, Phase.FAILED)


class ConditionType(StrEnum):
    """status.conditions[].type."""

    ADMITTED = "Admitted"  # Kueue admitted the job's Workload (only with --kueue)
    CREATED = "Created"
    SCHEDULED = "Scheduled"  # False while the scheduler cannot place pods of the attempt
    RENDEZVOUS_DONE = "RendezvousDone"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    BLOCKED = "Blocked"
    STRAGGLER = "Straggler"
    POD_INPUT_REJECTED = "PodInputRejected"  # a pod said what the operator refuses
    RUNTIME_RESOLVED = "RuntimeResolved"  # spec.runtimeRef found and recorded (status.runtime)
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Reason(StrEnum):
    """The reasons the reconciler gives its conditions and events, and the job-level failure
    reasons it decides itself. A failure's reason can also be one a pod reported (an
    exception's, OOMKilled, Evicted: reconcile/rootcause.py); those are the pod's words."""

    # Blocked
    OBJECT_IN_THE_WAY = "ObjectInTheWay"
    POD_CREATE_REFUSED = "PodCreateRefused"
    UNBLOCKED = "Unblocked"
    # Suspended, resumed
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    # a new attempt because the spec its pods come from changed (reconcile/attempts.py)
    SPEC_CHANGED = "SpecChanged"
    # Queued (Kueue): admitted, evicted, re-admitted
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    READMITTED = "Readmitted"
    # Created, RendezvousDone, Running, Restarting while an attempt starts and runs
    PODS_CREATED = "PodsCreated"
    WAITING = "Waiting"
    STARTED = "Started"
    ALL_PODS_SCHEDULED = "AllPodsScheduled"
    ALL_PODS_RUNNING = "AllPodsRunning"
    ALL_PODS_READY = "AllPodsReady"
    RENDEZVOUS_DONE = "RendezvousDone"  # the event when it completes
    RESTARTING = "Restarting"
    # Straggler
    MEASURING = "Measuring"
    NO_STRAGGLERS = "NoStragglers"
    SLOW_PODS = "SlowPods"
    NOT_RUNNING = "NotRunning"
    STRAGGLER = "Straggler"  # the event
    # Succeeded
    ALL_RANKS_SUCCEEDED = "AllRanksSucceeded"
    RANK_ZERO_SUCCEEDED = "RankZeroSucceeded"
    # Failed, and failures the reconciler names itself
    INVALID_SPEC = "InvalidSpec"
    RUNTIME_NOT_FOUND = "RuntimeNotFound"
    RUNTIME_RESOLVED = "RuntimeResolved"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    RESTART_BUDGET_EXHAUSTED = "RestartBudgetExhausted"
    CRASH_LOOP_NO_PROGRESS = "CrashLoopNoProgress"
    # the launcher's report state for a rendezvous that never completed, as the job's reason
    RENDEZVOUS_TIMEOUT = contract.RENDEZVOUS_TIMEOUT
    PROGRESS_STALLED = "ProgressStalled"
    POD_DELETED = "PodDeleted"
    NODE_LOST = "NodeLost"
    # a rank's or failure's reason from the kind of its worker's failure in the launcher's
    # report (reconcile/observe.py, KIND_REASONS)
    EXCEPTION = "Exception"
    SIGNAL = "Signal"
    COMMUNICATION_ERROR = "CommunicationError"
    NON_ZERO_EXIT = "NonZeroExit"
    # a failure's reason from what its GPU, NCCL or gloo said (reconcile/failurekinds.py)
    CUDA_OUT_OF_MEMORY = "CUDAOutOfMemory"
    GPU_DEVICE_ERROR = "GPUDeviceError"
    NCCL_TIMEOUT = "NCCLTimeout"
    GLOO_TIMEOUT = "GlooTimeout"
    NCCL_ERROR = "NCCLError"
    # events: the next attempts keep off a node (reconcile/failure/avoid.py)
    AVOIDING_NODE = "AvoidingNode"
    # Scheduled False: pods wait, kept off avoided nodes, and the scheduler finds no node
    # matching their node affinity (reconcile/gang.py)
    AVOIDED_NODES = "AvoidedNodes"
    # a pod kept off a node no longer avoided is created again without it: the event, its
    # status.ranks entry's reason, Scheduled False meanwhile (reconcile/failure/avoid.py)
    AVOIDANCE_LIFTED = "AvoidanceLifted"
    # events about single pods
    RANK_FAILED = "RankFailed"
    POD_REPLACED = "PodReplaced"
    POD_FORCE_DELETED = "PodForceDeleted"  # its kubelet never confirmed (reconcile/overdue.py)
    # PodInputRejected: a pod's status answer or report broke the pod contract
    POD_ANSWER_REJECTED = "PodAnswerRejected"


class RestartKind(StrEnum):
    """status.restarts[].kind: what caused a new attempt or a new pod."""

    USER = "user"
    INFRASTRUCTURE = "infrastructure"
    SUSPEND = "suspend"
    REPLACEMENT = "replacement"


class PodPhase(StrEnum):
    """A Kubernetes pod's status.phase."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class RankPhase(StrEnum):
    """status.ranks[].phase where it is not the pod's own phase (PodPhase)."""

    CREATING = "Creating"  # planned; the pod is not seen yet
    TERMINATING = "Terminating"  # being deleted
    DELETED = "Deleted"  # gone before it ended
