"""RFC 3339 timestamps as Kubernetes writes them."""

from __future__ import annotations

from datetime import UTC, datetime


def fmt(t: datetime | float) -> str:
    if not isinstance(t, datetime):
        t = datetime.fromtimestamp(t, UTC)
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(value: object) -> datetime | None:
    """Accept what a client hands over: datetime, RFC 3339 string, unix seconds, or None."""
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
    t = parse(value)
    return t.timestamp() if t else None
