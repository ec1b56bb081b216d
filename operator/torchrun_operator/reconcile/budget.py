"""Keeps the status within a size budget, whatever the job's size and its pods' messages.

etcd refuses objects over 1.5 MiB, and the spec and metadata share that room with the status:
a status past the limit could never be written again, and the job would be stuck forever.
Per-rank detail gives way first (messages are shortened evenly, then optional fields go);
the job's root cause (`status.failure`), conditions and counters are always kept whole.
"""

from __future__ import annotations

import json
from typing import Any

# 1 MiB for the status leaves half a MiB of etcd's 1.5 MiB object limit to spec and metadata.
STATUS_BUDGET_BYTES = 1024 * 1024
# Below this, a per-rank message says too little to be worth its room.
MIN_MESSAGE = 32
# A rank entry never takes more than this without its message (pod and node names at their
# longest are 63 and 253 characters); below budget/this, no entry can overflow it.
ENTRY_BOUND = 1024
# Per-rank fields dropped, in this order, when shortening messages is not enough.
OPTIONAL_FIELDS = ("message", "startedAt", "finishedAt", "node")
# Per-rank strings that can come from a pod (a report's state, a launcher's global ranks) are
# held to these lengths on every status, so that ENTRY_BOUND holds whatever pods say. A
# node's global ranks are a few ranges ("8-15"); a longer list is dropped, not cut (a cut
# list would name the wrong ranks).
MAX_REASON = 128
MAX_GLOBAL_RANKS = 256


def size(status: dict[str, Any]) -> int:
    return len(json.dumps(status, separators=(",", ":")).encode())


def bound(status: dict[str, Any], budget: int = STATUS_BUDGET_BYTES) -> dict[str, Any]:
    """`status` itself, trimmed in place until its JSON fits `budget` bytes."""
    ranks = status.get("ranks") or []
    for r in ranks:
        reason = r.get("reason")
        if isinstance(reason, str) and len(reason) > MAX_REASON:
            r["reason"] = reason[: MAX_REASON - 3] + "..."
        held = r.get("globalRanks")
        if isinstance(held, str) and len(held) > MAX_GLOBAL_RANKS:
            r.pop("globalRanks")
    if len(ranks) * ENTRY_BOUND * 2 < budget:
        return status  # small jobs: nothing to measure (messages are capped per rank)
    over = size(status) - budget
    if over <= 0:
        return status
    with_message = [r for r in ranks if r.get("message")]
    if with_message:
        room = sum(len(r["message"]) for r in with_message) - over
        per = room // len(with_message)
        for r in with_message:
            msg = r["message"]
            if per < MIN_MESSAGE:
                r.pop("message")
            elif len(msg) > per:
                r["message"] = msg[: per - 3] + "..."
    for field in OPTIONAL_FIELDS:
        if size(status) <= budget:
            break
        for r in ranks:
            r.pop(field, None)
    return status
