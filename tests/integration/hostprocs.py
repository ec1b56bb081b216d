"""A pod's training processes, found from this host's /proc: for clusters whose nodes run on
this host (localkube's process node; kind, whose node containers share this kernel), where a
test kills a worker or checks that a launcher outlived something.

A pod's processes are told from every other by their environment: the operator gives the
trainer container PET_LOCAL_ADDR, the pod's own IP (render/pod.py), and torchrun's workers
inherit it. The launcher is the one whose command line runs the launcher file; the workers
are its descendants that carry RANK (the topmost: a worker's own children inherit it too).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchrun_operator.render.pod import LAUNCHER_PATH


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces and ")")."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """Kernel start time of `pid` (telling a process from a later one with a reused PID)."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal (state T); a process gone is not."""
    fields = _stat(pid)
    return fields is not None and fields[0] == "T"


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid in _pids():
        ppid = _parent(pid)
        if ppid is not None:
            out.setdefault(ppid, []).append(pid)
    return out


def _descendants(root: int, found: Callable[[int], bool], below_found: bool) -> list[int]:
    """The processes under `root` for which `found` holds; with `below_found` False, not
    those under a process found."""
    tree = _children()
    out: list[int] = []
    todo = list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        hit = found(pid)
        if hit:
            out.append(pid)
        if below_found or not hit:
            todo.extend(tree.get(pid, []))
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")]


def launcher_pid(pod: Any) -> int | None:
    """Host PID of `pod`'s launcher (its trainer container's command, torchrun's agent);
    None while it has none (no IP yet, not started, or gone)."""
    ip = pod.status.pod_ip if pod.status else None
    if not ip:
        return None

    def ours(pid: int) -> bool:
        if LAUNCHER_PATH not in _argv(pid):
            return False
        env = _environ(pid)
        return env.get("PET_LOCAL_ADDR") == ip and "RANK" not in env

    found = [pid for pid in _pids() if ours(pid)]
    # A worker runs no launcher file, but a wrapper that execs one might show it for a moment.
    top = [p for p in found if _parent(p) not in found]
    return top[0] if len(top) == 1 else None


def worker_pids(root: int) -> dict[int, int]:
    """Global rank -> host PID of the torchrun workers under launcher `root` (the topmost
    processes that carry RANK: a worker's own children inherit it)."""

    def worker(pid: int) -> bool:
        env = _environ(pid)
        return "RANK" in env and "LOCAL_RANK" in env

    return {int(_environ(p)["RANK"]): p for p in _descendants(root, worker, below_found=False)}


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def descendants_named(root: int, name: str) -> list[int]:
    """Host PIDs of the processes under `root` (its children, theirs, ...) called `name`."""
    return _descendants(root, lambda pid: comm(pid) == name, below_found=True)
