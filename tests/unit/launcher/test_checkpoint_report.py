"""A checkpoint a training script reports through its progress file: parsed, bounded and
kept by the launcher (the latest one, even after later lines without it), shown at GET
/status, and handed to the workers of an in-pod restart as TORCHRUN_OPERATOR_RESUME_FROM."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from torchrun_operator.launcher import contract, progress, progress_file, report, shim, stacks
from torchrun_operator.reconcile import podinput


def line(**fields: object) -> str:
    return json.dumps(fields) + "\n"


def test_a_checkpoint_report_is_parsed_and_its_step_is_the_step_when_none_is_given() -> None:
    ck = {"step": 40, "path": "/ckpt/step-40.pt"}
    assert progress_file.parse_progress(line(step=41, checkpoint=ck)) == {
        "step": 41,
        "checkpoint": ck,
    }
    assert progress_file.parse_progress(line(checkpoint=ck)) == {"step": 40, "checkpoint": ck}


@pytest.mark.parametrize(
    "checkpoint",
    [
        {"step": -1, "path": "/a"},
        {"step": 2**60, "path": "/a"},
        {"step": 1, "path": ""},
        {"step": 1, "path": "x" * 1025},
        {"step": 1, "path": "/a\n/b"},
        {"step": 1, "path": 7},
        {"path": "/a"},
        "/a",
    ],
)
def test_a_bad_checkpoint_is_dropped_and_the_step_kept(checkpoint: object) -> None:
    assert progress_file.parse_progress(line(step=5, checkpoint=checkpoint)) == {"step": 5}


@pytest.mark.parametrize(
    "path", ["/elsewhere/step-5.pt", "/ckpt/../etc/passwd", "/ckpt/a/../b", "step-5.pt", "/ckptx/a"]
)
def test_a_checkpoint_outside_the_checkpoint_dir_is_dropped(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Neither reported (the operator would refuse the report) nor resumed from.
    monkeypatch.setenv(contract.ENV_CHECKPOINT_DIR, "/ckpt/")
    assert progress_file.parse_progress(line(step=5, checkpoint={"step": 5, "path": path})) == {
        "step": 5
    }
    inside = {"step": 5, "path": "/ckpt/step-5.a1"}
    assert progress_file.parse_progress(line(checkpoint=inside)) == {
        "step": 5,
        "checkpoint": inside,
    }


def test_the_meter_keeps_the_latest_checkpoint_across_lines_without_one() -> None:
    meter = progress_file.ProgressMeter(60)
    meter.observe(100.0, line(step=10, checkpoint={"step": 10, "path": "/c/10"}))
    meter.observe(101.0, line(step=11))
    snap = meter.snapshot(102.0)
    assert snap is not None and snap["checkpoint"] == {"step": 10, "path": "/c/10", "at": 100.0}
    meter.observe(103.0, line(step=20, checkpoint={"step": 20, "path": "/c/20"}))
    meter.observe(104.0, line(step=20, checkpoint={"step": 20, "path": "/c/20"}))  # same one
    snap = meter.snapshot(105.0)
    assert snap is not None and snap["checkpoint"] == {"step": 20, "path": "/c/20", "at": 103.0}


def test_a_restarted_worker_resumes_from_what_the_launcher_saw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shim.resume_from(str(tmp_path)) is None
    (tmp_path / contract.RESUME_FILE).write_text("/c/20")
    assert shim.resume_from(str(tmp_path)) == "/c/20"
    (tmp_path / contract.RESUME_FILE).write_text("x" * 1025)
    assert shim.resume_from(str(tmp_path)) is None

    # The shim sets it in the worker's environment before the script runs.
    (tmp_path / contract.RESUME_FILE).write_text("/c/20")
    script = tmp_path / "s.py"
    script.write_text("import os\nRESUME = os.environ.get('TORCHRUN_OPERATOR_RESUME_FROM')\n")
    monkeypatch.setenv(contract.ENV_STATE_DIR, str(tmp_path))
    monkeypatch.setenv(contract.ENV_RESUME_FROM, "/c/10")  # as rendered from status: older
    monkeypatch.setattr(stacks, "register_stack_dump", lambda sdir, rank: None)
    # worker_code sets these up as `python script.py` does: restored after the test.
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    code, scope = shim.worker_code(["python", str(script)])
    try:
        exec(code, scope)
    finally:
        os.environ.pop(contract.ENV_RESUME_FROM, None)
    assert scope["RESUME"] == "/c/20"


def test_the_final_report_carries_the_latest_checkpoint(tmp_path: Path) -> None:
    progress_path = tmp_path / "progress"
    progress_path.write_text(line(step=40, checkpoint={"step": 40, "path": "/c/40"}))
    summary = report.build_summary(
        contract.SUCCEEDED, step=40, checkpoint=progress.final_checkpoint(str(progress_path))
    )
    assert summary["checkpoint"] == {"step": 40, "path": "/c/40"}
    # the operator reads it back from the termination message
    parsed = podinput.parse_report(report.encode_summary(summary).decode())
    assert isinstance(parsed, dict) and parsed["checkpoint"] == {"step": 40, "path": "/c/40"}
    bad = dict(summary, checkpoint={"step": 40, "path": "x" * 2000})
    assert isinstance(podinput.parse_report(json.dumps(bad)), podinput.Rejected)
