"""What a pod's workers recorded, whatever ended the agent (launcher/recorded.py): real worker
processes, stopped the way torch's process context stops them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torchrun_operator.launcher import recorded, shim

# A worker that raised: its error file is written at once, as the shim writes it, then it
# takes `linger` seconds to exit (an atexit handler, garbage collection).
RAISED = """
import atexit, json, sys, time
path, linger = sys.argv[1], float(sys.argv[2])
atexit.register(time.sleep, linger)
with open(path, "w") as fp:
    json.dump({payload}, fp)
sys.exit(1)
"""
SLEEPER = "import time; time.sleep(60)"


def _payload(message: str, at: float) -> str:
    return json.dumps(shim.error_file_payload(KeyError(message), "Traceback ...", at))


class _Handler:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc


class _Context:
    """torch's SubprocessContext as far as the launcher looks at it; `close` stops the workers
    as torch's does (SIGTERM to those still running, then waits)."""

    def __init__(self, procs: dict[int, subprocess.Popen[bytes]], files: dict[int, str]) -> None:
        self.subprocess_handlers = {lr: _Handler(p) for lr, p in procs.items()}
        self.error_files = files

    def close(self) -> None:
        for h in self.subprocess_handlers.values():
            if h.proc.poll() is None:
                h.proc.send_signal(signal.SIGTERM)
        for h in self.subprocess_handlers.values():
            h.proc.wait(10)


@pytest.fixture
def workers(tmp_path: Path) -> Any:
    started: list[subprocess.Popen[bytes]] = []

    def start(*codes: tuple[str, list[str]]) -> _Context:
        procs, files = {}, {}
        for lr, (code, args) in enumerate(codes):
            files[lr] = str(tmp_path / f"error-{lr}.json")
            procs[lr] = subprocess.Popen([sys.executable, "-c", code, files[lr], *args])
            started.append(procs[lr])
        return _Context(procs, files)

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def _wait_for_file(path: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not Path(path).exists() or not Path(path).read_text().endswith("}"):
        assert time.monotonic() < end, f"{path} never written"
        time.sleep(0.02)


def _stop(ctx: _Context, bound: float = recorded.EXITING_WORKER_WAIT_SECONDS) -> list[Any]:
    stop = recorded.Stop(ctx)
    stop.before(bound)
    ctx.close()
    return stop.after({0: 4, 1: 5})


def test_a_worker_still_exiting_after_it_raised_is_waited_for_and_reported(workers: Any) -> None:
    """The race of issue 45: rank 4 raised and is still exiting when a peer's failure ends
    the agent. It is reported, with its own exit code, error and time; rank 5, stopped by the
    agent having recorded nothing, is not a failure."""
    at = time.time()
    ctx = workers((RAISED.format(payload=_payload("boom", at)), ["0.5"]), (SLEEPER, []))
    _wait_for_file(ctx.error_files[0])
    failures = recorded.failures(_stop(ctx), None)
    assert [(f["rank"], f["localRank"], f["exitCode"], f["kind"]) for f in failures] == [
        (4, 0, 1, "exception")
    ]
    assert failures[0]["error"] == "KeyError: 'boom'"
    assert failures[0]["at"] == pytest.approx(at, abs=0.001)


def test_a_worker_that_outlasts_the_wait_is_reported_by_its_error_file(workers: Any) -> None:
    """Past the wait the agent stops it like the others; what it recorded is reported all the
    same, with the signal that stopped it as its exit code."""
    ctx = workers((RAISED.format(payload=_payload("slow", time.time())), ["30"]), (SLEEPER, []))
    _wait_for_file(ctx.error_files[0])
    started = time.monotonic()
    failures = recorded.failures(_stop(ctx, bound=0.3), None)
    assert time.monotonic() - started < 10
    assert [(f["rank"], f["exitCode"], f["error"]) for f in failures] == [
        (4, -signal.SIGTERM, "KeyError: 'slow'")
    ]


def test_a_worker_that_exited_nonzero_on_its_own_is_a_failure(workers: Any, tmp_path: Path) -> None:
    """Exited before the stop without recording anything (a segfault, exit(3)): a failure, with
    the tail of its stderr, as torch reports one."""
    logs = tmp_path / "logs"
    (logs / "run_x" / "attempt_0" / "1").mkdir(parents=True)
    (logs / "run_x" / "attempt_0" / "1" / "stderr.log").write_text("fatal: no data\n")
    ctx = workers((SLEEPER, []), ("import sys; sys.exit(3)", []))
    ctx.subprocess_handlers[1].proc.wait(30)
    failures = recorded.failures(_stop(ctx), str(logs))
    assert [(f["rank"], f["exitCode"], f["kind"]) for f in failures] == [(5, 3, "exit")]
    assert "fatal: no data" in failures[0]["stderr"]


def test_workers_the_stop_ended_having_recorded_nothing_are_not_failures(workers: Any) -> None:
    ctx = workers((SLEEPER, []), (SLEEPER, []))
    started = time.monotonic()
    assert recorded.failures(_stop(ctx), None) == []
    assert time.monotonic() - started < recorded.EXITING_WORKER_WAIT_SECONDS  # nobody to wait for


def test_unreadable_or_huge_error_files_are_no_record(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"message": ')
    assert recorded.read_error_file(str(bad)) is None
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"message": "x" * (recorded.ERROR_FILE_LIMIT + 1)}))
    assert recorded.read_error_file(str(huge)) is None
    assert recorded.read_error_file(str(tmp_path / "none.json")) is None
    assert recorded.read_error_file(None) is None


def test_a_context_without_subprocesses_has_nothing_to_look_at() -> None:
    stop = recorded.Stop(SimpleNamespace())
    stop.before()
    assert stop.after({}) == []


def test_merged_keeps_one_failure_per_rank_preferring_the_recorded_error() -> None:
    def failure(rank: int, code: int, kind: str, at: float) -> Any:
        return {"rank": rank, "localRank": rank - 4, "exitCode": code, "kind": kind, "error": kind,
                "at": at}  # fmt: skip

    signalled, raised = failure(4, -15, "signal", 9.0), failure(4, -15, "exception", 8.0)
    other = failure(5, -9, "signal", 7.0)
    assert recorded.merged([signalled, other], [raised]) == [raised, other]
    assert recorded.merged([raised], [signalled]) == [raised]
