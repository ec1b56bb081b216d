"""What this pod's workers recorded, whatever ended the agent.

torchrun's agent reports the failures of the workers it saw exit (ChildFailedError). Every
other way the agent ends (another node's agent closed the rendezvous, the store was lost,
SIGTERM from the kubelet, the launcher's watchdog) reports none, whatever the workers had
recorded. Under load that loses the root cause: a worker that raised has written its error
file, but a Python process can take seconds to exit after that (garbage collection,
``atexit``, process-group teardown), and a peer's failure that comes a second later ends every
agent first. So whenever the agent stops its workers (torch's process context ``close``, which
every ending passes through), the launcher looks at each worker before and after: the error
files already written, with their own timestamps, and the exit codes of those that exited on
their own. A worker that wrote its error file and is still exiting is waited for a moment
first (EXITING_WORKER_WAIT_SECONDS), so it is reported with its own exit code; it is reported
either way.

Only reading the workers' files and polling their processes: nothing here runs in a worker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .contract import KIND_COMM, KIND_EXCEPTION, FailureRecord
from .report import error_text_from_record, failure_record
from .stderr import read_stderr_tail, stderr_log_path

# How long the agent waits, before it stops the workers, for one that has written its error
# file and is still exiting. Short on purpose: its error file already holds what the report
# needs, and the operator orders failures on its own clock, clamping each reported time to
# within seconds of when it saw the pod fail (reconcile/failure/settle.REPORT_LAG): a report
# that comes late is one whose failure looks late. The wait only buys the worker's own exit
# code instead of the signal that stopped it; the watchdog's grace (torchrun's shutdown
# timeout + 5 s) and the pod's grace period are far longer.
EXITING_WORKER_WAIT_SECONDS = 2.0
POLL_SECONDS = 0.05
# An error file is the worker's (the user's exception message and traceback); torchelastic
# reads it whole. Ours reads at most this much, and one larger is taken as unreadable: its
# worker is then reported by exit code and stderr tail, as one that recorded nothing.
ERROR_FILE_LIMIT = 4 << 20


class Process(Protocol):
    """What is used of a worker's subprocess.Popen."""

    def poll(self) -> int | None: ...


@dataclass(frozen=True)
class WorkerEnd:
    """One worker as the agent stopped it."""

    local_rank: int
    rank: int | None  # its global rank, when the worker group says it
    exit_code: int | None  # after the stop; None if it still had not exited
    exited_first: bool  # it had exited on its own before the agent stopped the workers
    error_file: str | None
    seen_at: float  # when the launcher looked (wall clock): a failure's time without a record


def read_error_file(path: str | None) -> Any:
    """A worker's error file as torchelastic's JSON, or None (none written, unreadable, too
    large, not JSON)."""
    if not path:
        return None
    try:
        with open(path, "rb") as fp:
            data = fp.read(ERROR_FILE_LIMIT + 1)
    except OSError:
        return None
    if len(data) > ERROR_FILE_LIMIT:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _has_record(path: str | None) -> bool:
    return error_text_from_record(read_error_file(path)) is not None


def wait_for_exiting(
    processes: Mapping[int, Process],
    error_files: Mapping[int, str],
    bound: float = EXITING_WORKER_WAIT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait, at most `bound` seconds, for the workers still running that have already written
    an error file: they raised and are on their way out."""
    exiting = [
        lr for lr, p in processes.items() if p.poll() is None and _has_record(error_files.get(lr))
    ]
    end = clock() + bound
    while exiting and clock() < end:
        sleep(POLL_SECONDS)
        exiting = [lr for lr in exiting if processes[lr].poll() is None]


class Stop:
    """One stop of a process context's workers, looked at on both sides: `before` (waits for
    the exiting, notes who had exited), the stop, then `after`. `pcontext` is torch's
    SubprocessContext (its `subprocess_handlers` and `error_files`, both by local rank); any
    other has no workers to look at."""

    def __init__(self, pcontext: Any) -> None:
        handlers = getattr(pcontext, "subprocess_handlers", None)
        files = getattr(pcontext, "error_files", None)
        self.processes: dict[int, Process] = (
            {int(lr): h.proc for lr, h in handlers.items()} if isinstance(handlers, Mapping) else {}
        )
        self.error_files: dict[int, str] = (
            {int(lr): str(f) for lr, f in files.items()} if isinstance(files, Mapping) else {}
        )
        self.exited_first: set[int] = set()

    def before(self, bound: float = EXITING_WORKER_WAIT_SECONDS) -> None:
        wait_for_exiting(self.processes, self.error_files, bound)
        self.exited_first = {lr for lr, p in self.processes.items() if p.poll() is not None}

    def after(self, ranks: Mapping[int, int]) -> list[WorkerEnd]:
        """`ranks`: global rank by local rank."""
        now = time.time()
        return [
            WorkerEnd(
                local_rank=lr,
                rank=ranks.get(lr),
                exit_code=p.poll(),
                exited_first=lr in self.exited_first,
                error_file=self.error_files.get(lr),
                seen_at=now,
            )
            for lr, p in sorted(self.processes.items())
        ]


def failures(ends: Iterable[WorkerEnd], log_dir: str | None) -> list[FailureRecord]:
    """The failures among the stopped workers: each that recorded an error (whatever ended
    it), and each that exited non-zero on its own before the stop. A worker the stop itself
    ended, having recorded nothing, is a consequence, not a failure: left out."""
    out: list[FailureRecord] = []
    for end in ends:
        if end.rank is None:
            continue
        data = read_error_file(end.error_file)
        recorded = error_text_from_record(data) is not None
        failed_first = end.exited_first and end.exit_code not in (None, 0)
        if not recorded and not failed_first:
            continue
        code = end.exit_code if end.exit_code is not None else 1
        out.append(
            failure_record(
                rank=end.rank,
                local_rank=end.local_rank,
                exitcode=code,
                error_file_data=data,
                fallback_message="",
                timestamp=end.seen_at,
                stderr=None
                if recorded or log_dir is None
                else read_stderr_tail(stderr_log_path(log_dir, end.local_rank)),
            )
        )
    return out


def merged(
    reported: Iterable[FailureRecord], recorded: Iterable[FailureRecord]
) -> list[FailureRecord]:
    """torchrun's own failures with those the launcher found, one per rank: where both have
    one, the one with the worker's recorded error (torch builds its failures before it stops
    the other workers, so a worker that raised while the stop went on is in `recorded` only)."""
    by_rank: dict[int, FailureRecord] = {int(f["rank"]): f for f in reported}
    for f in recorded:
        rank = int(f["rank"])
        own = by_rank.get(rank)
        if own is None or (_is_recorded(f) and not _is_recorded(own)):
            by_rank[rank] = f
    return [by_rank[r] for r in sorted(by_rank)]


def _is_recorded(f: FailureRecord) -> bool:
    # Only a recorded error makes these kinds (report.classify_failure).
    return f.get("kind") in (KIND_EXCEPTION, KIND_COMM)
