"""Stacks: a stalled pod's workers dump theirs on SIGUSR1 (faulthandler), the launcher
summarises where each main thread is; on a communication failure the ranks outside any
collective go into the report.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .contract import LOCATION_LIMIT, MAX_REPORT_STACKS
from .frames import Frame, describe, users_frame
from .logline import log
from .report import truncate_text
from .state import file_size, read_rank_files

# How long the launcher waits for its workers' stack dumps when training stalls.
STACK_DUMP_WAIT = 3.0
# Stack frames in these files mean "waiting in a collective".
_COLLECTIVE_PATHS = ("/torch/distributed/", "/torch/nn/parallel/")


_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_THREAD = re.compile(r"^(?:Current thread|Thread) (?P<ident>0x[0-9a-fA-F]+)")


def analyze_stacks(
    text: str, main_thread: int | None, library_dirs: Sequence[str] | None = None
) -> dict[str, Any]:
    """From a faulthandler dump: whether the main thread is inside a collective (a frame of
    torch.distributed or torch.nn.parallel), and where it is: its innermost frame of the
    user's code (launcher/frames.py), else its innermost frame."""
    blocks: dict[int | None, list[tuple[str, int, str]]] = {}
    current: list[tuple[str, int, str]] | None = None
    first: int | None = None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            ident = int(m.group("ident"), 16)
            current = blocks.setdefault(ident, [])
            if first is None or line.startswith("Current thread"):
                first = ident
            continue
        f = _FRAME.match(line)
        if f and current is not None:
            current.append((f.group("file"), int(f.group("line")), f.group("func")))
    frames = blocks.get(main_thread) if main_thread is not None else None
    if frames is None:
        frames = blocks.get(first, [])
    if not frames:
        return {"inCollective": False, "at": None}
    in_collective = any(any(p in f for p in _COLLECTIVE_PATHS) for f, _, _ in frames)
    # faulthandler lists the innermost frame first.
    place = users_frame([Frame(*fr) for fr in reversed(frames)], library_dirs)
    return {"inCollective": in_collective, "at": describe(place) if place else None}


def dump_worker_stacks(sdir: str, wait: float = STACK_DUMP_WAIT) -> list[dict[str, Any]]:
    """Have every worker of this node that registered a stack dump (the Python ones) write
    its stacks, copy them to the log, and summarise each."""
    targets = []
    for r in read_rank_files(sdir):
        path, pid = r.get("stacks"), r.get("pid")
        if not isinstance(path, str) or not isinstance(pid, int):
            continue
        try:
            offset = os.path.getsize(path)
            os.kill(pid, signal.SIGUSR1)
        except OSError as e:
            log("cannot dump stacks", rank=r.get("rank"), error=e)
            continue
        targets.append((r, path, offset))
    deadline = time.monotonic() + wait
    sizes: dict[str, int] = {}
    while targets and time.monotonic() < deadline:
        time.sleep(0.1)
        now = {path: file_size(path) for _, path, _ in targets}
        grown = all(now[path] > offset for _, path, offset in targets)
        if grown and now == sizes:
            break  # every dump written, and none still growing
        sizes = now
    out = []
    for r, path, offset in targets:
        try:
            with open(path, errors="replace") as fp:
                fp.seek(offset)
                text = fp.read()
        except OSError:
            text = ""
        thread = r.get("thread")
        summary = analyze_stacks(text, thread if isinstance(thread, int) else None)
        log(
            "stacks of a stalled rank",
            rank=r.get("rank"),
            local_rank=r.get("localRank"),
            in_collective=summary["inCollective"],
            at=summary["at"],
        )
        try:
            sys.stderr.write(text if text.endswith("\n") or not text else text + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        out.append({"rank": r.get("rank"), "localRank": r.get("localRank"), **summary})
    return sorted(out, key=lambda s: s["rank"] if isinstance(s["rank"], int) else -1)


# Stacks on a communication failure.
#
# When a collective times out or a peer drops out, the rank that failed first is a victim: the
# cause is the rank that never arrived, still alive somewhere outside the collective. On the
# first communication failure the agent sees (a worker's error or stderr tail, or its own
# rendezvous store gone), before torchrun stops the workers, every live worker of this node
# dumps its stacks; the ranks found outside a collective go into the report (`stacks`).

comm_stacks: list[dict[str, Any]] = []  # what the dump found (once per launcher)
_comm_dumped: list[bool] = []


def report_stacks(stacks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The report's `stacks`: the ranks outside any collective, at most MAX_REPORT_STACKS."""
    out = []
    for s in stacks:
        rank, at = s.get("rank"), s.get("at")
        if s.get("inCollective") or not isinstance(rank, int) or isinstance(rank, bool):
            continue
        entry: dict[str, Any] = {"rank": rank, "inCollective": False}
        if isinstance(at, str) and at:
            entry["at"] = truncate_text(at, LOCATION_LIMIT)
        out.append(entry)
    return out[:MAX_REPORT_STACKS]


def on_comm_failure(sdir: str, why: str) -> None:
    """The first communication failure: dump the live workers' stacks (once)."""
    if _comm_dumped:
        return
    _comm_dumped.append(True)
    log("communication failure: dumping the workers' stacks", why=truncate_text(why, 300))
    comm_stacks[:] = report_stacks(dump_worker_stacks(sdir))


def dump_own_stacks(why: str) -> None:
    """The launcher's own threads, to the log (a rendezvous that never completed)."""
    log("launcher stacks follow", reason=why)
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def register_stack_dump(sdir: str, local_rank: str) -> str | None:
    """In a Python worker: SIGUSR1 dumps every thread's stack to stacks-<local rank>.txt."""
    path = os.path.join(sdir, f"stacks-{local_rank}.txt")
    try:
        fp = open(path, "w")  # noqa: SIM115 - kept open for faulthandler for the process's life
        faulthandler.register(signal.SIGUSR1, file=fp, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError, AttributeError) as e:
        log("worker: no stack dumps", error=e)
        return None
    _stack_files.append(fp)
    return path


_stack_files: list[Any] = []
