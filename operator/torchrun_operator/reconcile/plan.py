"""What one reconciliation asks the shell to do, and what it decided."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..api.status_names import ConditionType, Phase, RestartKind


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class PhaseChanged:
    """status.phase went from `before` to `after`."""

    before: str  # as the job's status had it
    after: Phase


@dataclass(frozen=True)
class Restarted:
    """A recovery spent from failurePolicy.maxRestarts: a gang restart (kind infrastructure)
    or the replacement of one elastic pod (kind replacement)."""

    kind: RestartKind


@dataclass(frozen=True)
class Reached:
    """A start-up milestone of the attempt: the Running or RendezvousDone condition turned
    True, `seconds` after the attempt began (the latest gang restart's decision, else the
    job's creation); None when that time is unknown. Condition times are whole seconds, and
    so is this."""

    condition: Literal[ConditionType.RUNNING, ConditionType.RENDEZVOUS_DONE]
    seconds: float | None


# What happened to the job in one reconciliation, in the order it was decided: the facts the
# metrics count (metrics.record_plan). Recorded only once the status that carries them is
# written, so a plan whose write was refused counts nothing.
Transition = PhaseChanged | Restarted | Reached


@dataclass(frozen=True)
class Plan:
    """Apply in order: patch status (only if it differs from the job's), delete pods (and
    force the deletion of those in `force_delete`), create pods, emit events, then requeue or
    delete the job. Creates treat 409 as done and deletes treat 404 as done: plans are
    recomputed from scratch every time."""

    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    # Pods still Terminating long after their grace period: deleted with a grace of 0.
    force_delete: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False
    transitions: list[Transition] = field(default_factory=list)
