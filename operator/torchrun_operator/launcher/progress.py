"""The progress watch (docs/progress.md): readiness withdrawn when the progress file
stops changing, stacks dumped, the latest checkpoint kept for restarts and the report.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .contract import (
    ENV_PROGRESS_FILE,
    ENV_PROGRESS_TIMEOUT,
    ENV_PROGRESS_WINDOW,
    READY_FILE,
    RESUME_FILE,
    STALLED_FILE,
)
from .logline import log
from .progress_file import parse_progress, read_progress_text, read_step
from .stacks import dump_worker_stacks
from .state import compact_json, rank_info, read_text, write_atomic
from .status_server import LIVE

DEFAULT_PROGRESS_WINDOW = 60.0


def final_checkpoint(path: str | None) -> dict[str, Any] | None:
    """The latest checkpoint for the final report: the progress file's last line's, else the
    latest the progress thread saw (a checkpoint saved just before the end, on SIGTERM say, is
    in the report even when no read of the status endpoint saw it)."""
    found = parse_progress(read_progress_text(path))
    if found is not None and found.get("checkpoint") is not None:
        return dict(found["checkpoint"])
    return LIVE.checkpoint()


class ProgressWatch:
    """Decides, from what it is shown, when training stopped making progress.

    The clock starts when `ready` appears (rendezvous done, workers started) and restarts
    whenever the progress file's content changes. When it reaches ``timeout`` the watch
    reports "stall"; a later change of the file reports "resume"; a `ready` written anew by
    the workers of another round (torchrun's in-pod restart) re-arms it.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.since: float | None = None  # start of the current quiet period
        self.content: str | None = None
        self.stalled = False

    def observe(self, now: float, ready: bool, content: str | None) -> str:
        changed = content != self.content
        self.content = content
        if self.stalled:
            if changed or ready:
                self.stalled, self.since = False, now
                return "resume" if changed else ""
            return ""
        if not ready:
            self.since = None
            return ""
        if self.since is None or changed:
            self.since = now
            return ""
        if now - self.since >= self.timeout:
            self.stalled = True
            return "stall"
        return ""


class ProgressMonitor:
    """Applies a ProgressWatch to the state dir: on a stall, withdraws readiness (removes
    `ready`, so the readiness probe fails) and writes a `stalled` marker; on progress again,
    puts `ready` back."""

    def __init__(
        self,
        sdir: str,
        progress_file: str,
        timeout: float,
        on_stall: Callable[[], None] | None = None,
    ) -> None:
        self.on_stall = on_stall  # runs before readiness is withdrawn (the stack dumps)
        self.ready_path = os.path.join(sdir, READY_FILE)
        self.stalled_path = os.path.join(sdir, STALLED_FILE)
        self.progress_file = progress_file
        self.watch = ProgressWatch(timeout)
        self._ready_text: str | None = None
        self.note: str | None = None  # for the termination summary while stalled

    def poll(self, now: float, wall: float | None = None) -> str:
        ready_text = read_text(self.ready_path)
        if ready_text is not None:
            self._ready_text = ready_text
        action = self.watch.observe(
            now, ready_text is not None, read_progress_text(self.progress_file)
        )
        step = read_step(self.progress_file)
        if action == "stall":
            quiet = self.watch.timeout
            self.note = f"no training progress for {quiet:g}s (last step {step})"
            log(
                "progress stalled: withdrawing readiness",
                file=self.progress_file,
                step=step,
                timeout=f"{quiet:g}s",
                ranks=",".join(str(r) for r in rank_info(os.path.dirname(self.ready_path), [])[1]),
            )
            if self.on_stall is not None:
                # Before the pod turns NotReady: the operator reads the pod when it does.
                try:
                    self.on_stall()
                except Exception as e:  # noqa: BLE001 - the stall must still be reported
                    log("cannot dump stacks", error=f"{type(e).__name__}: {e}")
            marker = {"step": step, "timeout": quiet, "at": round(wall or time.time(), 3)}
            try:
                write_atomic(self.stalled_path, compact_json(marker) + "\n")
                os.remove(self.ready_path)
            except OSError as e:
                log("cannot withdraw readiness", error=e)
        elif action == "resume":
            self.note = None
            log("progress resumed: readiness restored", step=step)
            try:
                write_atomic(self.ready_path, self._ready_text or "{}\n")
                os.remove(self.stalled_path)
            except OSError as e:
                log("cannot restore readiness", error=e)
        elif not self.watch.stalled:
            self.note = None
        return action


monitors: list[ProgressMonitor] = []  # the stall watch, once started: its note goes in the report


def progress_timeout() -> float | None:
    raw = os.environ.get(ENV_PROGRESS_TIMEOUT, "")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        log("ignoring invalid progress timeout", value=raw)
        return None
    return value if value > 0 else None


def progress_window() -> float:
    raw = os.environ.get(ENV_PROGRESS_WINDOW, "")
    try:
        value = float(raw) if raw else DEFAULT_PROGRESS_WINDOW
    except ValueError:
        log("ignoring invalid progress window", value=raw)
        return DEFAULT_PROGRESS_WINDOW
    return value if value > 0 else DEFAULT_PROGRESS_WINDOW


def on_stall(sdir: str, monitor: ProgressMonitor) -> None:
    """Training stopped: every Python worker dumps its stacks (to the log, summarised for
    GET /status), so the operator can name the rank that is not inside a collective."""
    stacks = dump_worker_stacks(sdir)
    LIVE.set_stall(
        {"at": round(time.time(), 3), "step": read_step(monitor.progress_file), "stacks": stacks}
    )


def start_progress_monitor(sdir: str) -> ProgressMonitor | None:
    """Reads the progress file every second (less with a short timeout) for GET /status, and
    with TORCHRUN_OPERATOR_PROGRESS_TIMEOUT watches it for stalls (docs/progress.md). Returns
    the stall watch, None without a timeout."""
    timeout, path = progress_timeout(), os.environ.get(ENV_PROGRESS_FILE)
    if not path:
        return None
    monitor = None
    if timeout is not None:
        watch = monitor = ProgressMonitor(sdir, path, timeout)
        monitor.on_stall = lambda: on_stall(sdir, watch)
    window = progress_window()
    interval = min(1.0, timeout / 4) if timeout is not None else 1.0
    if monitor is not None:
        monitors.append(monitor)
        log("watching training progress", file=path, timeout=f"{timeout:g}s")

    resume = os.path.join(sdir, RESUME_FILE)
    written: list[str | None] = [None]

    def run() -> None:
        while True:
            try:
                LIVE.observe_progress(time.time(), read_progress_text(path), window)
                checkpoint = LIVE.checkpoint()
                if checkpoint is not None and checkpoint["path"] != written[0]:
                    # Workers of an in-pod restart resume from it (worker_code).
                    write_atomic(resume, checkpoint["path"])
                    written[0] = checkpoint["path"]
                if monitor is not None and monitor.poll(time.monotonic()) == "resume":
                    LIVE.set_stall(None)
            except Exception as e:  # noqa: BLE001 - the watch must never kill the launcher
                log("progress watch error", error=f"{type(e).__name__}: {e}")
            time.sleep(interval)

    threading.Thread(target=run, daemon=True, name="progress-watch").start()
    return monitor
