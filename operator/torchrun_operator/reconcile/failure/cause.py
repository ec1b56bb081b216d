"""A failure's root cause as the status (`status.failure`), events and messages show it."""

from __future__ import annotations

from typing import Any

from ...api.status_names import Reason
from ...api.timefmt import fmt
from ..context import Ctx
from ..observe import truncate
from ..rootcause import Candidate


def failure_record(cause: Candidate, step: int | None = None) -> dict[str, Any]:
    """status.failure."""
    out = {
        "rank": cause.rank,
        "index": cause.node_index,
        "nodeRank": cause.node_rank,
        "pod": cause.pod,
        "node": cause.node,
        "exitCode": cause.exit_code,
        "kind": cause.shown_kind,
        "reason": cause.reason,
        "message": cause.message,
        "at": fmt(cause.at),
        "step": step,
        "location": cause.location,
    }
    return {k: v for k, v in out.items() if v is not None}


def record_failure(ctx: Ctx, cause: Candidate, step: int | None) -> None:
    """The attempt failed: its root cause into status.failure, and an event."""
    ctx.status["failure"] = failure_record(cause, step)
    ctx.event("Warning", Reason.RANK_FAILED, describe(cause))


def where(pod: str, index: int, node_rank: int | None = None, node: str | None = None) -> str:
    """'pod job-1 (index 1, node rank 0, node n1)': a pod as messages name it."""
    parts = [f"index {index}"]
    if node_rank is not None:
        parts.append(f"node rank {node_rank}")
    if node:
        parts.append(f"node {node}")
    return f"pod {pod} ({', '.join(parts)})"


def describe(cause: Candidate) -> str:
    """'rank 3 (pod job-1, index 1, node rank 0, node n1) failed: ...', or without a known
    rank 'pod job-1 (index 1, ...) failed: ...'."""
    place = where(cause.pod, cause.node_index, cause.node_rank, cause.node)
    if cause.rank is not None:
        place = f"rank {cause.rank} ({place.replace(' (', ', ', 1)}"
    code = f", exit code {cause.exit_code}" if cause.exit_code is not None else ""
    detail = f": {cause.message}" if cause.message else ""
    return truncate(f"{place} failed: {cause.reason}{code}{detail}") or ""
