"""The tail of a worker's stderr in the launcher's report: a worker that exits without an error
file (argparse's exit 2, exit(1) after logging, a segfault) said why only there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from torchrun_operator.launcher import contract, report, stderr, torchrun_flags

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "failures"
ARGPARSE = (
    b"usage: train.py [-h] --local_rank LOCAL_RANK [--epochs EPOCHS]\n"
    b"train.py: error: the following arguments are required: --local_rank\n"
)


@pytest.mark.parametrize(
    ("flags", "env", "added"),
    [
        ([], {}, ["--log_dir", "/s/logs", "--tee", "2"]),
        (["--tee", "1"], {}, ["--log_dir", "/s/logs", "--tee", "3"]),
        (["-t", "3"], {}, ["--log_dir", "/s/logs"]),
        (["-t3"], {}, ["--log_dir", "/s/logs"]),
        (["-t1"], {}, ["--log_dir", "/s/logs", "--tee", "3"]),
        (["-r2"], {}, ["--log_dir", "/s/logs"]),
        (["--tee=2", "--log_dir=/mine"], {}, []),
        ([], {"PET_TEE": "1", "PET_LOG_DIR": "/env"}, ["--tee", "3"]),
        # the user's own choices stand: a per-rank mapping, stderr redirected off the console
        (["--tee", "0:1,1:0"], {}, ["--log_dir", "/s/logs"]),
        (["--redirects", "2"], {}, ["--log_dir", "/s/logs"]),
        (["-r", "3"], {}, ["--log_dir", "/s/logs"]),
        (["--redirects", "1"], {}, ["--log_dir", "/s/logs", "--tee", "2"]),
    ],
)
def test_stderr_capture_flags(flags: list[str], env: dict[str, str], added: list[str]) -> None:
    out, log_dir = stderr.stderr_capture_flags(flags, env, "/s/logs")
    assert out == [*flags, *added]
    given = torchrun_flags.flag_value(flags, ("--log-dir", "--log_dir")) or env.get("PET_LOG_DIR")
    assert log_dir == (given or "/s/logs")


def test_stderr_log_path_finds_the_newest_attempt_of_a_local_rank(tmp_path: Path) -> None:
    assert stderr.stderr_log_path(str(tmp_path), 0) is None
    old = tmp_path / "job_abc" / "attempt_0" / "1" / "stderr.log"
    new = tmp_path / "job_abc" / "attempt_1" / "1" / "stderr.log"
    other = tmp_path / "job_abc" / "attempt_1" / "0" / "stderr.log"
    for p in (old, new, other):
        p.parent.mkdir(parents=True)
        p.write_text(str(p))
    os.utime(old, (1, 1))
    assert stderr.stderr_log_path(str(tmp_path), 1) == str(new)
    assert stderr.stderr_log_path(str(tmp_path), 0) == str(other)


def test_read_stderr_tail_keeps_the_last_whole_lines(tmp_path: Path) -> None:
    p = tmp_path / "stderr.log"
    p.write_bytes(b"noise line\n" * 100_000 + ARGPARSE + b"\n\n")
    tail = stderr.read_stderr_tail(str(p))
    assert tail is not None and len(tail) <= contract.STDERR_TAIL_LIMIT
    assert tail.endswith("error: the following arguments are required: --local_rank")
    assert all(line == "noise line" for line in tail.splitlines()[:-2])
    assert stderr.read_stderr_tail(str(tmp_path / "missing")) is None
    (tmp_path / "empty").write_bytes(b"")
    assert stderr.read_stderr_tail(str(tmp_path / "empty")) is None


def test_clean_stderr_tail_handles_progress_bars_colours_and_junk() -> None:
    data = (
        b"\x1b[31mERROR\x1b[0m boom\r\n"
        + b"10%|#   |\r50%|#####|\r"
        + bytes([0xFF, 0xFE, 0x00, 0x07])
        + b"Fatal Python error: Aborted\n"
    )
    assert stderr.clean_stderr_tail(data, partial_head=False) == (
        "ERROR boom\n10%|#   |\n50%|#####|\n\ufffd\ufffdFatal Python error: Aborted"
    )
    # a read that began mid-line drops that line; one long line keeps its end
    assert stderr.clean_stderr_tail(b"tial line\nwhole\n", partial_head=True) == "whole"
    assert (
        stderr.clean_stderr_tail(b"x" * 5000 + b"END", partial_head=False, limit=10) == "xxxxxxxEND"
    )


def test_failure_record_keeps_stderr_only_without_a_recorded_error() -> None:
    bare = report.failure_record(0, 0, 2, {"message": "<NONE>"}, "", 1.0, stderr="usage: ...")
    assert bare["stderr"] == "usage: ..." and bare["kind"] == "exit"
    recorded = {"message": {"message": "RuntimeError: x", "extraInfo": {}}}
    assert "stderr" not in report.failure_record(0, 0, 1, recorded, "", 1.0, stderr="tb")
    assert "stderr" not in report.failure_record(0, 0, 2, None, "", 1.0, stderr="")
    long = report.failure_record(0, 0, -11, None, "SIGSEGV", 1.0, stderr="y" * 9000 + "Z")
    assert len(long["stderr"]) == contract.STDERR_TAIL_LIMIT and long["stderr"].endswith("Z")


def test_stderr_tails_are_shortened_to_fit_never_the_json() -> None:
    tail = ("noise " * 400)[: contract.STDERR_TAIL_LIMIT - 60] + "\nerror: required: --local_rank"
    failures = [report.failure_record(r, r, 2, None, "", 100.0 + r, stderr=tail) for r in range(8)]
    summary = report.build_summary(contract.FAILED, group_rank=0, ranks=range(8), failures=failures)
    data = report.encode_summary(summary)
    assert len(data) <= contract.TERMINATION_LIMIT
    out = json.loads(data)
    assert len(out["failures"]) + out.get("omitted", 0) == 8
    first = out["failures"][0]
    assert first["stderr"].endswith("error: required: --local_rank")
    assert first["error"] == "exited with code 2 without recording an error"
    # one failure alone keeps its whole tail
    one = json.loads(
        report.encode_summary(report.build_summary(contract.FAILED, failures=failures[:1]))
    )
    assert one["failures"][0]["stderr"] == tail


def test_the_tail_of_an_nccl_watchdog_abort_keeps_the_watchdogs_line(tmp_path: Path) -> None:
    """The whole stderr of a rank whose NCCL watchdog aborted it (captured on 2 x H200, torch
    2.11): two C++ backtraces and faulthandler's module list follow the watchdog's line. The
    tail drops those and keeps the line, the abort and the Python stack, within the limit;
    the last 2048 characters alone held no word of the timeout."""
    raw = (FIXTURES / "h200-nccl-watchdog-stderr.log").read_bytes()
    assert b"Watchdog caught" not in raw[-contract.STDERR_TAIL_LIMIT :]
    p = tmp_path / "stderr.log"
    p.write_bytes(raw)
    tail = stderr.read_stderr_tail(str(p))
    assert tail is not None and len(tail) <= contract.STDERR_TAIL_LIMIT
    assert "Process group watchdog thread terminated with exception: [Rank 0] Watchdog caught" in (
        tail
    )
    assert "Fatal Python error: Aborted" in tail
    assert tail.endswith('File "<string>", line 4 in <module>')
    assert "frame #" not in tail and "Extension modules" not in tail and "\n\n\n" not in tail


def test_one_long_line_keeps_its_head_and_its_end() -> None:
    line = "terminate called: " + "y" * 5000 + " the end"
    tail = stderr.clean_stderr_tail(("before\n" + line + "\nafter\n").encode(), partial_head=False)
    kept = tail.splitlines()
    assert kept[0] == "before" and kept[2] == "after"
    assert kept[1].startswith("terminate called: ") and kept[1].endswith(" the end")
    assert "..." in kept[1] and len(kept[1]) <= 512
