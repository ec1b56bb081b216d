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
from pathlib import Path
from typing import Any

from torchrun_operator.render.pod import LAUNCHER_PATH


def start_time(pid: int) -> int | None:
    """Kernel start time of `pid` (telling a process from a later one with a reused PID)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid in _pids():
        ppid = _parent(pid)
        if ppid is not None:
            out.setdefault(ppid, []).append(pid)
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
    found = [
        pid
        for pid in _pids()
        if LAUNCHER_PATH in _argv(pid)
        and _environ(pid).get("PET_LOCAL_ADDR") == ip
        and "RANK" not in _environ(pid)
    ]
    # A worker runs no launcher file, but a wrapper that execs one might show it for a moment.
    top = [p for p in found if _parent(p) not in found]
    return top[0] if len(top) == 1 else None


def worker_pids(root: int) -> dict[int, int]:
    """Global rank -> host PID of the torchrun workers under launcher `root`."""
    tree = _children()
    found: dict[int, int] = {}
    todo = list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        env = _environ(pid)
        if "RANK" in env and "LOCAL_RANK" in env:
            found[int(env["RANK"])] = pid
        else:
            todo.extend(tree.get(pid, []))
    return found


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def descendants_named(root: int, name: str) -> list[int]:
    """Host PIDs of the processes under `root` (its children, theirs, ...) called `name`."""
    tree = _children()
    found: list[int] = []
    todo = list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        if comm(pid) == name:
            found.append(pid)
        todo.extend(tree.get(pid, []))
    return found
