"""The job's training progress and its stragglers, from what the pods' launchers report.

Pure: the per-pod figures are in the status entries (`step`, `stepsPerSecond`, `stepSeconds`,
`lastStepAt`, see observe.rank_entry); what only the live reads know (the declared total, whether
a launcher's averaging window is full) comes in as `observe.Live`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.timefmt import fmt, seconds
from .observe import Live
from .podinput import MAX_COUNT, CheckpointReport


def _int(value: object) -> int | None:
    """A step or total in its documented range (podinput.MAX_COUNT): the entries and the
    status written before may hold numbers an older operator took from a pod unchecked."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def _float(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def job_progress(
    entries: Sequence[Mapping[str, Any]],
    live: Mapping[int, Live],
    before: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """status.progress: the lowest step of the pods that report one (every pod got that
    far), the declared total, the median rate, and when the total is reached at that rate."""
    reporting = [e for e in entries if _int(e.get("step")) is not None]
    if not reporting:
        return None
    slowest = min(reporting, key=lambda e: (int(e["step"]), e.get("index", 0)))
    step = int(slowest["step"])
    totals = [t for lv in live.values() if (t := _int(lv.total)) is not None]
    total = max(totals) if totals else _int((before or {}).get("totalSteps"))
    rates = [r for e in reporting if (r := _float(e.get("stepsPerSecond"))) is not None and r > 0]
    rate = statistics.median(rates) if rates else None
    out: dict[str, Any] = {"step": step}
    if total is not None:
        out["totalSteps"] = total
    if rate is not None:
        out["stepsPerSecond"] = float(f"{rate:.3g}")
    # From the slowest pod's last step, not from now: the status changes only with the data.
    last = seconds(slowest.get("lastStepAt"))
    if total is not None and rate is not None and last is not None:
        left = max(total - step, 0) / out["stepsPerSecond"]
        if left < 10 * 366 * 24 * 3600:
            out["eta"] = fmt(last + left)
    return out


def checkpoints(
    live: Mapping[int, Live], reports: Sequence[Mapping[str, Any] | None]
) -> list[CheckpointReport]:
    """What the pods reported: running pods at their status endpoint, ended pods in their
    final report (both validated by podinput)."""
    out = [lv.checkpoint for lv in live.values() if lv.checkpoint is not None]
    for report in reports:
        found = (report or {}).get("checkpoint")
        if isinstance(found, Mapping) and _int(found.get("step")) is not None:
            out.append(CheckpointReport(int(found["step"]), str(found.get("path"))))
    return out


def last_checkpoint(
    reports: Sequence[CheckpointReport], before: Mapping[str, Any] | None, stamp: str
) -> dict[str, Any] | None:
    """status.lastCheckpoint: the reported checkpoint of the highest step, if it is newer than
    the one before (a higher step, or the same step saved elsewhere); kept across attempts, so
    the next attempt's pods resume from it. `time` is when the operator first saw it
    (`stamp`, its own clock: a pod's clock may be off)."""
    old = before if isinstance(before, Mapping) else None
    if not reports:
        return dict(old) if old else None
    best = max(reports, key=lambda c: (c.step, c.at or 0.0))
    old_step = _int(old.get("step")) if old else None
    if (
        old
        and old_step is not None
        and (best.step < old_step or (best.step == old_step and best.path == old.get("path")))
    ):
        return dict(old)
    return {"step": best.step, "path": best.path, "time": stamp}


@dataclass(frozen=True)
class Slow:
    index: int
    pod: str
    node_rank: int | None
    global_ranks: str | None
    step_seconds: float
    ratio: float


def stragglers(
    entries: Sequence[Mapping[str, Any]], live: Mapping[int, Live], factor: float
) -> tuple[list[Slow], float] | None:
    """The running pods whose mean step time over a full window is above `factor` times the
    (low) median of all judged pods, and that median; None while fewer than two pods can be
    judged. The low median: with two pods, the faster one is the yardstick."""
    judged: list[tuple[Mapping[str, Any], float]] = []
    for e in entries:
        lv = live.get(int(e.get("index", -1)))
        if e.get("phase") != "Running" or lv is None or not lv.window_full:
            continue
        if lv.step_seconds is None or lv.step_seconds <= 0:
            continue
        judged.append((e, lv.step_seconds))
    if len(judged) < 2:
        return None
    median = statistics.median_low([t for _, t in judged])
    slow = [
        Slow(
            int(e["index"]),
            str(e.get("pod")),
            _int(e.get("nodeRank")),
            e.get("globalRanks"),
            t,
            t / median,
        )
        for e, t in judged
        if t > factor * median
    ]
    return sorted(slow, key=lambda s: (-s.ratio, s.index)), median


def straggler_message(slow: list[Slow], median: float, factor: float, window: int) -> str:
    parts = []
    for s in slow:
        who = [f"index {s.index}"]
        if s.node_rank is not None:
            who.append(f"node rank {s.node_rank}")
        if s.global_ranks:
            who.append(f"global ranks {s.global_ranks}")
        parts.append(
            f"pod {s.pod} ({', '.join(who)}) takes {s.step_seconds:.3g}s per step, "
            f"{s.ratio:.1f}x the median"
        )
    return (
        f"{'; '.join(parts)} (median {median:.3g}s per step over {window}s; threshold {factor:g}x)"
    )
