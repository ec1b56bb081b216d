"""What one reconciliation asks the shell to do."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """Apply in order: delete pods, create pods, patch status (only if it differs from the
    job's), emit events, then requeue or delete the job. Creates treat 409 as done and deletes
    treat 404 as done: plans are recomputed from scratch every time."""

    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False
