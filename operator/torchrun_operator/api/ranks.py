"""Compact global-rank lists: [0, 1, 2, 3, 8, 9] <-> "0-3,8-9"."""

from __future__ import annotations

from collections.abc import Iterable


def format_ranks(ranks: Iterable[int]) -> str:
    """Format ranks as sorted, merged ranges; duplicates are dropped, "" for none."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        start = end = ordered[i]
        while i + 1 < len(ordered) and ordered[i + 1] == end + 1:
            i += 1
            end = ordered[i]
        parts.append(str(start) if start == end else f"{start}-{end}")
        i += 1
    return ",".join(parts)


def parse_ranks(text: str) -> list[int]:
    """Inverse of format_ranks; raises ValueError on malformed input."""
    ranks: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        start = int(lo)
        end = int(hi) if sep else start
        if start < 0 or end < start:
            raise ValueError(f"bad rank range {part!r}")
        ranks.extend(range(start, end + 1))
    return sorted(set(ranks))
