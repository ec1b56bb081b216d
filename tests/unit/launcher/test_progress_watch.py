"""The launcher's progress watch: readiness is withdrawn when the step counter stops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torchrun_operator.launcher import contract, progress, state


def test_watch_starts_at_rendezvous_and_restarts_on_every_change() -> None:
    w = progress.ProgressWatch(10)
    assert w.observe(0, ready=False, content=None) == ""
    assert w.observe(100, ready=False, content=None) == ""  # before rendezvous: no clock
    assert w.observe(101, ready=True, content=None) == ""  # clock starts
    assert w.observe(110, ready=True, content="1\n") == ""  # progress: clock restarts
    assert w.observe(119, ready=True, content="1\n") == ""
    assert w.observe(120, ready=True, content="1\n") == "stall"
    assert w.stalled
    assert w.observe(125, ready=False, content="1\n") == ""  # stays stalled, says it once
    assert w.observe(126, ready=False, content="2\n") == "resume"
    assert not w.stalled
    assert w.observe(135, ready=True, content="2\n") == ""
    assert w.observe(136, ready=True, content="2\n") == "stall"


def test_a_script_that_never_reports_stalls_after_the_timeout() -> None:
    w = progress.ProgressWatch(5)
    w.observe(0, ready=True, content=None)
    assert w.observe(5, ready=True, content=None) == "stall"


def test_ready_written_anew_rearms_a_stalled_watch() -> None:
    w = progress.ProgressWatch(5)
    w.observe(0, ready=True, content="3")
    assert w.observe(5, ready=True, content="3") == "stall"
    assert w.observe(6, ready=True, content="3") == ""  # a new worker round wrote ready
    assert not w.stalled
    assert w.observe(10, ready=True, content="3") == ""
    assert w.observe(11, ready=True, content="3") == "stall"


def test_monitor_withdraws_and_restores_readiness(tmp_path: Path) -> None:
    progress_path = tmp_path / "progress"
    ready = tmp_path / "ready"
    ready.write_text('{"rank": 1}\n')
    m = progress.ProgressMonitor(str(tmp_path), str(progress_path), 10)
    progress_path.write_text("7\n")
    assert m.poll(0) == ""
    assert m.poll(9) == ""
    assert ready.exists()
    assert m.poll(10) == "stall"
    assert not ready.exists()
    marker = json.loads((tmp_path / "stalled").read_text())
    assert marker["step"] == 7 and marker["timeout"] == 10
    assert m.note == "no training progress for 10s (last step 7)"
    assert m.poll(11) == ""
    progress_path.write_text("8\n")
    assert m.poll(12) == "resume"
    assert ready.read_text() == '{"rank": 1}\n'
    assert not (tmp_path / "stalled").exists()
    assert m.note is None


@pytest.mark.parametrize(("raw", "value"), [("", None), ("30", 30.0), ("x", None), ("0", None)])
def test_progress_timeout_from_env(
    raw: str, value: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(contract.ENV_PROGRESS_TIMEOUT, raw)
    assert progress.progress_timeout() == value


def test_no_monitor_without_timeout_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(contract.ENV_PROGRESS_TIMEOUT, raising=False)
    monkeypatch.setenv(contract.ENV_PROGRESS_FILE, str(tmp_path / "progress"))
    assert progress.start_progress_monitor(str(tmp_path)) is None
    monkeypatch.setenv(contract.ENV_PROGRESS_TIMEOUT, "5")
    monkeypatch.delenv(contract.ENV_PROGRESS_FILE)
    assert progress.start_progress_monitor(str(tmp_path)) is None


def test_reset_state_dir_forgets_a_stall(tmp_path: Path) -> None:
    (tmp_path / "stalled").write_text("{}")
    (tmp_path / "ready").write_text("{}")
    state.reset_state_dir(str(tmp_path))
    assert not (tmp_path / "stalled").exists() and not (tmp_path / "ready").exists()
