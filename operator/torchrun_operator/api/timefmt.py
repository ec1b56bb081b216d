"""RFC 3339 timestamps as Kubernetes writes them ("2026-11-26T01:02:03Z").

The one parser and formatter of the package: the reconciler, the metrics and kubectl-dtj all
read status and pod times through it. It lives in `api`, the lowest layer, so the CLI and the
metrics get it without importing the reconciler (and pydantic with it).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime

__all__ = ["fmt", "parse", "restamp", "seconds"]

# Distinct time strings remembered by `restamp`: the pods of a job start and end within a
# few seconds of each other, so a 512-pod status holds a handful of distinct ones.
RESTAMP_MEMO_SIZE = 4096


def fmt(t: datetime | float) -> str:
    """A datetime (naive means UTC) or unix seconds, as RFC 3339 in UTC, whole seconds."""
    if not isinstance(t, datetime):
        t = datetime.fromtimestamp(t, UTC)
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(value: object) -> datetime | None:
    """Accept what a client hands over: datetime, RFC 3339 string, unix seconds, or None.

    Returns an aware datetime (naive input is taken as UTC), or None for anything else,
    an unparsable string included: a status written by another operator version must not
    break whoever reads it.
    """
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        try:
            t = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return t if t.tzinfo else t.replace(tzinfo=UTC)
    return None


def seconds(value: object) -> float | None:
    """`parse`, as unix seconds."""
    t = parse(value)
    return t.timestamp() if t else None


@functools.lru_cache(maxsize=RESTAMP_MEMO_SIZE)
def _restamp_str(value: str) -> str | None:
    t = parse(value)
    return fmt(t) if t else None


def restamp(value: object) -> str | None:
    """`parse`, then `fmt`: any time `parse` accepts as the status writes it; None if none.
    Every reconcile restamps every pod's start and end, so strings are remembered."""
    if isinstance(value, str):
        return _restamp_str(value)
    t = parse(value)
    return fmt(t) if t else None
