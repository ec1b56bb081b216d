"""Pure helpers of the in-pod launcher: classification, truncation, the summary's size bound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import reports
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrun_operator.launcher import contract, progress_file, report, shim, torchrun_flags


def _record(message: str) -> dict[str, object]:
    return {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"},
        }
    }


@pytest.mark.parametrize(
    ("exitcode", "error", "kind"),
    [
        (1, "RuntimeError: rank 3 failed on purpose", "exception"),
        # a raising worker may die of SIGABRT in an unclean teardown: the record decides
        (-6, "RuntimeError: rank 3 failed on purpose", "exception"),
        (
            1,
            "RuntimeError: [../gloo/transport/tcp/pair.cc:561] Connection closed by peer "
            "[127.0.0.1]:4242",
            "comm",
        ),
        (
            -15,
            "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
            "1800000ms for recv operation to complete",
            "comm",
        ),
        (1, "torch.distributed.DistNetworkError: failed to recv, got 0 bytes", "comm"),
        (1, "DistBackendError: NCCL communicator was aborted on rank 2", "comm"),
        (-6, "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2)", "comm"),
        (1, "BrokenPipeError: [Errno 32] Broken pipe", "comm"),
        (1, "ConnectionResetError: [Errno 104] Connection reset by peer", "comm"),
        (-9, None, "signal"),
        (-15, None, "signal"),
        (-6, None, "signal"),
        (3, None, "exit"),
        (1, "", "exit"),
        (1, "ValueError: loss is nan", "exception"),
        # an agent's message (the operator classifies those with the same patterns)
        (1, "RendezvousConnectionError: The connection to the C10d store has failed.", "comm"),
        (1, "RendezvousClosedError", "comm"),
    ],
)
def test_classify_failure(exitcode: int, error: str | None, kind: str) -> None:
    assert report.classify_failure(exitcode, error) == kind


def test_failure_record_reads_torchelastic_error_file() -> None:
    f = report.failure_record(3, 1, -6, _record("RuntimeError: boom"), "ignored", 1700000009)
    assert f == {
        "rank": 3,
        "localRank": 1,
        "exitCode": -6,
        "kind": "exception",
        "error": "RuntimeError: boom",
        "at": 1700000000.0,
    }


def test_failure_record_without_error_file() -> None:
    sig = report.failure_record(1, 1, -9, {}, "Signal 9 (SIGKILL) received by PID 7", 1700000001)
    assert sig["kind"] == "signal" and "SIGKILL" in sig["error"] and sig["at"] == 1700000001.0
    # what ProcessFailure holds when the worker wrote no error file
    none = report.failure_record(1, 1, -9, {"message": "<NONE>"}, "Signal 9 (SIGKILL)", 1700000001)
    assert none["kind"] == "signal" and none["error"] == "Signal 9 (SIGKILL)"
    ex = report.failure_record(0, 0, 3, {}, "To enable traceback see: https://...", 1700000001)
    assert ex["kind"] == "exit" and ex["error"] == ("exited with code 3 without recording an error")


def test_failure_record_prefers_precise_timestamp() -> None:
    rec = _record("RuntimeError: boom")
    rec["message"]["extraInfo"]["timestampPrecise"] = "1700000000.250"  # type: ignore[index]
    assert report.failure_record(0, 0, 1, rec, "", 1)["at"] == 1700000000.25


def test_truncate_keeps_exception_line_of_traceback() -> None:
    tb = (
        "Traceback (most recent call last):\n"
        + "  File x.py, line 1\n" * 500
        + ("RuntimeError: the useful bit")
    )
    out = report.truncate_text(tb, 300)
    assert len(out) <= 300
    assert out.endswith("RuntimeError: the useful bit")
    assert out.startswith("Traceback")
    assert report.truncate_text("short", 300) == "short"


def _failure(
    rank: int, kind: contract.FailureKind, error: str, at: float = 1.0
) -> contract.FailureRecord:
    return reports.failure(rank, kind, at, error, local_rank=rank)


def test_huge_message_fits_and_stays_valid_json() -> None:
    big = "RuntimeError: " + "x" * 100_000 + " END"
    s = report.build_summary(
        contract.FAILED,
        group_rank=0,
        ranks=[0, 1],
        failures=[_failure(1, "exception", big), _failure(0, "signal", "Signal 15 (SIGTERM)")],
    )
    data = report.encode_summary(s)
    assert len(data) <= contract.TERMINATION_LIMIT
    parsed = json.loads(data)
    assert parsed["state"] == "Failed" and parsed["ranks"] == [0, 1]
    assert [f["rank"] for f in parsed["failures"]] == [1, 0]
    assert parsed["failures"][0]["error"].startswith("RuntimeError: ")
    assert parsed["failures"][0]["error"].endswith(" END")
    assert "omitted" not in parsed


def test_many_failures_drop_least_telling_and_count_them() -> None:
    failures = [
        _failure(r, "signal", "Signal 15 (SIGTERM) received by PID 1" * 3, at=2.0)
        for r in range(200)
    ]
    failures.append(_failure(150, "exception", "RuntimeError: root cause", at=5.0))
    data = report.encode_summary(
        report.build_summary(contract.FAILED, ranks=range(200), failures=failures)
    )
    parsed = json.loads(data)
    assert len(data) <= contract.TERMINATION_LIMIT
    assert parsed["failures"][0]["kind"] == "exception"
    assert "root cause" in parsed["failures"][0]["error"]
    assert parsed["omitted"] + len(parsed["failures"]) == 201


@settings(max_examples=60, deadline=None)
@given(
    errors=st.lists(st.text(min_size=0, max_size=3000), min_size=0, max_size=40),
    message=st.one_of(st.none(), st.text(max_size=8000)),
)
def test_encoded_summary_always_fits(errors: list[str], message: str | None) -> None:
    failures = [_failure(i, contract.KIND_ORDER[i % 4], e) for i, e in enumerate(errors)]
    data = report.encode_summary(
        report.build_summary(
            contract.FAILED, ranks=range(len(errors)), failures=failures, message=message
        )
    )
    assert len(data) <= contract.TERMINATION_LIMIT
    parsed = json.loads(data.decode("utf-8"))
    assert parsed["v"] == 1 and parsed["state"] == "Failed"


def test_exit_code_follows_root_failure() -> None:
    assert report.exit_code_for([_failure(0, "signal", "")]) == 1
    f = _failure(3, "exit", "")
    f["exitCode"] = 7
    assert report.exit_code_for([_failure(0, "comm", "x") | {"exitCode": -15}, f]) == 7
    assert report.exit_code_for([]) == 1


@pytest.mark.parametrize(
    ("argv", "env", "host"),
    [
        (["--rdzv-endpoint", "job-0.job:29400"], {}, "job-0.job"),
        (["--rdzv_endpoint=job-0.job:29400"], {}, "job-0.job"),
        ([], {"PET_RDZV_ENDPOINT": "job-0.job:1"}, "job-0.job"),
        (["--rdzv-endpoint", "[::1]:29400"], {}, "::1"),
        (["--rdzv-endpoint", "job-0.job"], {}, "job-0.job"),
        (["--nnodes", "2"], {}, None),
    ],
)
def test_endpoint_host(argv: list[str], env: dict[str, str], host: str | None) -> None:
    assert torchrun_flags.endpoint_host(argv, env) == host


def test_split_argv() -> None:
    assert torchrun_flags.split_argv(["--nnodes", "1", "--", "python", "t.py", "--", "x"]) == (
        ["--nnodes", "1"],
        ["python", "t.py", "--", "x"],
    )
    with pytest.raises(ValueError):
        torchrun_flags.split_argv(["--nnodes", "1", "python", "t.py"])
    with pytest.raises(ValueError):
        torchrun_flags.split_argv(["--nnodes", "1", "--"])


@pytest.mark.parametrize(
    ("cmd", "target"),
    [
        (["python", "train.py", "--epochs", "3"], ("path", "train.py", ["--epochs", "3"])),
        (["/usr/bin/python3.11", "-u", "t.py"], ("path", "t.py", [])),
        (["python3", "-m", "pkg.train", "-x"], ("module", "pkg.train", ["-x"])),
        (["python", "-c", "print(1)"], None),
        (["bash", "-c", "exit 3"], None),
        (["python"], None),
    ],
)
def test_python_target(cmd: list[str], target: object) -> None:
    assert shim.python_target(cmd) == target


def test_read_step(tmp_path: Path) -> None:
    p = tmp_path / "progress"
    assert progress_file.read_step(str(p)) is None
    p.write_text("41\n")
    assert progress_file.read_step(str(p)) == 41
    p.write_text('{"step": 7, "loss": 0.1}')
    assert progress_file.read_step(str(p)) == 7
    p.write_text("garbage")
    assert progress_file.read_step(str(p)) is None


def test_worker_error_file_matches_torchelastic_format() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError as e:
        payload = shim.error_file_payload(e, "Traceback...\nRuntimeError: boom\n", 1700000000.5)
    assert payload["message"]["message"] == "RuntimeError: boom"
    # torchelastic parses int(extraInfo.timestamp): it must stay an integer string
    assert int(payload["message"]["extraInfo"]["timestamp"]) == 1700000000


def test_help_and_bad_args_without_torch(tmp_path: Path, launcher_pyz: Path) -> None:
    """The operator ships the zipapp to images we don't know: --help and argument errors must
    not need torch (-I isolates from site-packages, so torch is not importable)."""
    help_ = subprocess.run(
        [sys.executable, "-I", str(launcher_pyz), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert help_.returncode == 0 and "usage:" in help_.stdout
    term = tmp_path / "term"
    bad = subprocess.run(
        [sys.executable, "-I", str(launcher_pyz), "--nnodes", "1", "python", "x.py"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"TORCHRUN_OPERATOR_TERMINATION_LOG": str(term)},
    )
    assert bad.returncode == 2
    summary = json.loads(term.read_text())
    assert summary["state"] == "Error" and "--" in summary["message"]
