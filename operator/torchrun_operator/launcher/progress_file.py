"""The progress file a training script writes (docs/progress.md): untrusted input,
parsed once and bounded; and the meter of steps per second over a window.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections import deque
from typing import Any

from .contract import ENV_CHECKPOINT_DIR, checkpoint_outside
from .logline import log

# The progress file is written by the user's script: untrusted input. The launcher reads at
# most its last PROGRESS_READ_LIMIT bytes, decodes JSON only when it is shallow (json's decoder
# recurses: a deeply nested array raised RecursionError and broke the launcher), and takes
# only finite numbers in range; any other read is ignored (logged once).
PROGRESS_READ_LIMIT = 4096
MAX_STEP = 2**53  # step and total: integers 0..2**53 (exact as JSON numbers everywhere)
MAX_STEP_TIME = 1e6  # stepTime: seconds, 0..10**6 (sums of them stay finite)
MAX_CHECKPOINT_PATH = 1024  # checkpoint.path: characters (longer: the report is ignored)
_MAX_JSON_NESTING = 16
_DIGITS = re.compile(r"[0-9]{1,32}", re.ASCII)
_progress_warned: set[str] = set()


def _progress_int(value: Any) -> int | None:
    """A step or total: an integer (or integral float, or a string of digits) 0..MAX_STEP."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = int(value) if _DIGITS.fullmatch(value) else None
    elif isinstance(value, float):
        value = int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, int) and 0 <= value <= MAX_STEP:
        return value
    return None


def _progress_seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond float
        return None
    return seconds if 0 <= seconds <= MAX_STEP_TIME else None  # NaN fails both


def _ignore_progress(text: str, why: str) -> None:
    if not _progress_warned:
        _progress_warned.add(why)
        log("ignoring progress file content (logged once)", why=why, content=repr(text[:80]))


def _checkpoint(value: Any) -> dict[str, Any] | None:
    """A checkpoint report {"step": n, "path": "..."}: step 0..MAX_STEP, a path of 1 to
    MAX_CHECKPOINT_PATH characters without NUL or line breaks; anything else is None."""
    if not isinstance(value, dict):
        return None
    step, path = _progress_int(value.get("step")), value.get("path")
    if step is None or not isinstance(path, str) or not 0 < len(path) <= MAX_CHECKPOINT_PATH:
        return None
    if any(c in path for c in "\0\n\r"):
        return None
    return {"step": step, "path": path}


def parse_progress(text: str | None) -> dict[str, Any] | None:
    """What a training script wrote to the progress file (docs/progress.md): its last line
    "<step>" or "<step> <total>", or JSON {"step": n, "total": m, "stepTime": s, "checkpoint":
    {"step": c, "path": p}} (total, stepTime and checkpoint optional: the declared number of
    steps, the seconds this rank spent on its own work in the last step, a checkpoint just
    saved; without "step", a checkpoint's step is the step). None when there is no valid step
    in it; a total, stepTime or checkpoint out of range is dropped, and so is a checkpoint
    outside $TORCHRUN_OPERATOR_CHECKPOINT_DIR when that is set. Never raises."""
    text = (text or "").strip()
    if not text:
        return None
    data: Any = None
    if text.startswith("{") and text.count("{") + text.count("[") <= _MAX_JSON_NESTING:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
    if isinstance(data, dict):
        checkpoint = _checkpoint(data.get("checkpoint"))
        storage = os.environ.get(ENV_CHECKPOINT_DIR)
        outside = (
            checkpoint_outside(checkpoint["path"], storage) if checkpoint and storage else None
        )
        if data.get("checkpoint") is not None and checkpoint is None:
            _ignore_progress(text, "checkpoint is not {step: 0..2**53, path: 1..1024 chars}")
        elif outside is not None:
            # Never resumed from (contract.checkpoint_outside), so never reported either.
            _ignore_progress(text, f"checkpoint path {outside}")
            checkpoint = None
        step = _progress_int(data.get("step", checkpoint["step"] if checkpoint else None))
        if step is None:
            _ignore_progress(text, "no step in 0..2**53")
            return None
        out: dict[str, Any] = {"step": step}
        total = _progress_int(data.get("total"))
        if total is not None:
            out["total"] = total
        step_time = _progress_seconds(data.get("stepTime"))
        if step_time is not None:
            out["stepTime"] = step_time
        if checkpoint is not None:
            out["checkpoint"] = checkpoint
        return out
    if text.startswith(("{", "[")):
        _ignore_progress(text, "not a JSON object of at most 16 levels")
        return None
    words = text.splitlines()[-1].split()
    if not words or len(words) > 2 or not all(_DIGITS.fullmatch(w) for w in words):
        _ignore_progress(text, "last line is not '<step>' or '<step> <total>'")
        return None
    step, total = _progress_int(words[0]), _progress_int(words[1]) if len(words) == 2 else None
    if step is None:
        _ignore_progress(text, "no step in 0..2**53")
        return None
    return {"step": step} if total is None else {"step": step, "total": total}


def read_progress_text(path: str | None) -> str | None:
    """The progress file's last PROGRESS_READ_LIMIT bytes (whole lines), or None when there is
    no regular file. Opened without blocking: a FIFO there must not hang the reader."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        start = max(0, st.st_size - PROGRESS_READ_LIMIT)
        data = os.pread(fd, PROGRESS_READ_LIMIT, start)
    except OSError:
        return None
    finally:
        os.close(fd)
    if start > 0:  # began mid-file: drop the partial first line
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    return data.decode("utf-8", errors="replace")


def read_step(path: str | None) -> int | None:
    """Last step a training script wrote to the progress file (see parse_progress)."""
    found = parse_progress(read_progress_text(path))
    return found["step"] if found else None


class ProgressMeter:
    """Steps per second and time per step over a sliding window, from what the progress file
    said each time it was read. Pure: it is shown (wall time, file content) and keeps the
    moments the step changed."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.samples: deque[tuple[float, int, float | None]] = deque()  # (t, step, stepTime)
        self.step: int | None = None
        self.total: int | None = None
        self.last_step_at: float | None = None
        self.first_at: float | None = None  # when a step was first seen
        self.checkpoint: dict[str, Any] | None = None  # the latest reported, with "at"

    def observe(self, now: float, text: str | None) -> None:
        found = parse_progress(text)
        if found is None:
            return
        step = int(found["step"])
        checkpoint = found.get("checkpoint")
        if checkpoint is not None and (
            self.checkpoint is None
            or (checkpoint["step"], checkpoint["path"])
            != (self.checkpoint["step"], self.checkpoint["path"])
        ):
            self.checkpoint = {**checkpoint, "at": round(now, 3)}
        if found.get("total") is not None:
            self.total = int(found["total"])
        if step != self.step:
            if self.step is not None and step < self.step:
                self.samples.clear()  # restored from an earlier checkpoint: start anew
                self.first_at = None
            self.step = step
            self.last_step_at = now
            self.samples.append((now, step, found.get("stepTime")))
            if self.first_at is None:
                self.first_at = now
        # Keep the window's samples and the one just before it (where the window starts).
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()

    def snapshot(self, now: float) -> dict[str, Any] | None:
        if self.step is None:
            return None
        out: dict[str, Any] = {"step": self.step, "windowSeconds": self.window}
        if self.total is not None:
            out["total"] = self.total
        if self.checkpoint is not None:
            out["checkpoint"] = dict(self.checkpoint)
        if self.last_step_at is not None:
            out["lastStepAt"] = round(self.last_step_at, 3)
        if len(self.samples) >= 2:
            t0, s0, _ = self.samples[0]
            t1, s1, _ = self.samples[-1]
            if now > t0 and s1 > s0:
                # To now, not to the last change: a pod that stopped slows down here.
                out["stepsPerSecond"] = round((s1 - s0) / (now - t0), 4)
                out["stepSeconds"] = round((t1 - t0) / (s1 - s0), 4)
            reported = [t for _, _, t in list(self.samples)[1:] if t is not None]
            if reported:
                out["stepSeconds"] = round(sum(reported) / len(reported), 4)
        in_window = sum(1 for t, _, _ in self.samples if t > now - self.window)
        out["windowFull"] = bool(
            self.first_at is not None and now - self.first_at >= self.window and in_window >= 3
        )
        return out
