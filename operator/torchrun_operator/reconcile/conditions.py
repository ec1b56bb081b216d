"""Status conditions with Kubernetes semantics: lastTransitionTime moves only on a flip."""

from __future__ import annotations

from typing import Any


def get(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: list[dict[str, Any]], type_: str) -> bool:
    c = get(conditions, type_)
    return c is not None and c.get("status") == "True"


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
) -> bool:
    """Set in place; returns True when the status flipped (or the condition is new)."""
    value = "True" if status else "False"
    old = get(conditions, type_)
    new = {"type": type_, "status": value, "reason": reason, "message": message}
    if old is None:
        conditions.append({**new, "lastTransitionTime": now})
        return True
    flipped = old.get("status") != value
    old.update(new)
    if flipped or "lastTransitionTime" not in old:
        old["lastTransitionTime"] = now
    return flipped
