"""The launcher's live status: the progress file's forms, steps per second over a window, the
read-only GET /status endpoint, and the stacks a stalled pod's workers dump."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from localkube.procs import free_port
from torchrun_operator.launcher import progress_file, stacks, state, status_server, torchrun_flags


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("41\n", {"step": 41}),
        ("41 1000\n", {"step": 41, "total": 1000}),
        ("1\n2\n3\n", {"step": 3}),
        ('{"step": 7, "loss": 0.1}', {"step": 7}),
        ('{"step": 7, "total": 70, "stepTime": 0.25}', {"step": 7, "total": 70, "stepTime": 0.25}),
        ('{"step": 7, "total": "many"}', {"step": 7}),
        ("garbage", None),
        ("", None),
        (None, None),
        ("true", None),
        ('{"loss": 1}', None),
    ],
)
def test_parse_progress(text: str | None, parsed: dict[str, float] | None) -> None:
    assert progress_file.parse_progress(text) == parsed


def test_meter_measures_steps_per_second_and_step_time_over_its_window() -> None:
    m = progress_file.ProgressMeter(window=10)
    assert m.snapshot(0) is None
    for k in range(0, 41):  # a step every 0.5 s for 20 s, read every 0.5 s
        m.observe(k * 0.5, f"{k} 100")
    snap = m.snapshot(20.0)
    assert snap is not None
    assert snap["step"] == 40 and snap["total"] == 100 and snap["lastStepAt"] == 20.0
    assert snap["stepsPerSecond"] == pytest.approx(2.0, rel=0.06)
    assert snap["stepSeconds"] == pytest.approx(0.5, rel=0.06)
    assert snap["windowFull"] is True
    # No step for 10 s: the rate falls (to now), the step time stays what it was.
    later = m.snapshot(30.0)
    assert later is not None and later["stepsPerSecond"] < 1.1


def test_meter_prefers_the_scripts_own_step_time_and_needs_a_full_window() -> None:
    m = progress_file.ProgressMeter(window=10)
    for k in range(1, 6):
        m.observe(k * 1.0, json.dumps({"step": k, "stepTime": 0.2}))
    snap = m.snapshot(5.0)
    assert snap is not None
    assert snap["stepSeconds"] == pytest.approx(0.2)
    assert snap["windowFull"] is False  # 4 s of steps, the window is 10 s
    m.observe(3.0 + 100, "2")  # restored from an earlier checkpoint: measured anew
    snap = m.snapshot(103.0)
    assert snap is not None and snap["step"] == 2 and "stepsPerSecond" not in snap


def test_status_endpoint_serves_the_live_state_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    state = status_server.LiveState()
    monkeypatch.setattr(status_server, "LIVE", state)
    state.update(index=1, rdzvId="uid-0", state="Training", groupRank=0, ranks=[0, 1], round=0)
    state.observe_progress(time.time(), "5 10", window=60)
    port = free_port()
    server = status_server.start_status_server(port)
    assert server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as resp:
            data = json.loads(resp.read())
        assert data["v"] == 1 and data["groupRank"] == 0 and data["ranks"] == [0, 1]
        assert data["progress"]["step"] == 5 and data["progress"]["total"] == 10
        assert data["index"] == 1 and data["rdzvId"] == "uid-0" and "time" in data
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=2)
        assert err.value.code == 404
        req = urllib.request.Request(f"http://127.0.0.1:{port}/status", method="POST", data=b"")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=2)
        assert err.value.code == 501
        # A second server on the port (a hostNetwork neighbour) is skipped, not fatal.
        assert status_server.start_status_server(port) is None
    finally:
        server.shutdown()
        server.server_close()


def test_stall_state_and_finish() -> None:
    state = status_server.LiveState()
    state.update(state="Training")
    state.set_stall({"at": 1.0, "step": 3, "stacks": []})
    assert state.snapshot(2.0)["state"] == "Stalled" and state.snapshot(2.0)["stall"]["step"] == 3
    state.set_stall(None)
    assert state.snapshot(2.0)["state"] == "Training" and "stall" not in state.snapshot(2.0)


def test_flag_value() -> None:
    flags = ["--nnodes", "2", "--rdzv-id", "u-3", "--rdzv_conf=x"]
    assert torchrun_flags.flag_value(flags, ("--rdzv-id", "--rdzv_id")) == "u-3"
    assert torchrun_flags.flag_value(["--rdzv_id=u-4"], ("--rdzv-id", "--rdzv_id")) == "u-4"
    assert torchrun_flags.flag_value([], ("--rdzv-id",)) is None


DUMP = """\
Thread 0x00007f1111111111 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 622 in wait

Current thread 0x00007f2222222222 (most recent call first):
  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 2806 in all_reduce
  File "/venv/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/workspace/train.py", line 57 in step
  File "/workspace/train.py", line 80 in <module>
  File "<frozen runpy>", line 88 in _run_code
"""

LIBS = ("/usr/lib/python3.11/", "/venv/site-packages/")


def test_analyze_stacks_tells_a_rank_in_a_collective_from_one_outside() -> None:
    main = 0x00007F2222222222
    found = stacks.analyze_stacks(DUMP, main, LIBS)
    assert found == {"inCollective": True, "at": "/workspace/train.py:57 in step"}
    outside = DUMP.replace("/torch/distributed/", "/torch/utils/")
    assert stacks.analyze_stacks(outside, main, LIBS)["inCollective"] is False
    # The main thread is found by its id, not by who handled the signal.
    assert stacks.analyze_stacks(DUMP, 0x00007F1111111111, LIBS) == {
        "inCollective": False,
        "at": "/usr/lib/python3.11/threading.py:324 in wait",
    }
    assert stacks.analyze_stacks("", main, LIBS) == {"inCollective": False, "at": None}


def test_a_stack_in_a_package_directory_sysconfig_does_not_name_is_not_the_users() -> None:
    """Debian's /usr/lib/python3/dist-packages (and any other site-packages or dist-packages
    directory) holds installed packages, whatever the interpreter's own paths say."""
    main = 0x00007F2222222222
    dump = DUMP.replace("/venv/site-packages/", "/usr/lib/python3/dist-packages/")
    assert stacks.analyze_stacks(dump, main, ("/usr/lib/python3.11/",))["at"] == (
        "/workspace/train.py:57 in step"
    )


WORKER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {launcher!r})
    from torchrun_launcher import shim, stacks

    def stuck_in_io():
        open({ready!r}, "w").close()
        time.sleep(60)  # the line the dump names

    path = stacks.register_stack_dump({sdir!r}, "0")
    shim._record_worker_state({sdir!r}, path)
    stuck_in_io()
    """
)


def test_a_workers_stacks_are_dumped_to_the_log_and_summarised(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    launcher_pyz: Path,
) -> None:
    sdir = tmp_path / "state"
    sdir.mkdir()
    script = tmp_path / "worker.py"
    ready = tmp_path / "started"
    script.write_text(WORKER.format(launcher=str(launcher_pyz), sdir=str(sdir), ready=str(ready)))
    env = dict(os.environ, LOCAL_RANK="0", RANK="3", GROUP_RANK="1")
    proc = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        found = stacks.dump_worker_stacks(str(sdir), wait=5)
        assert len(found) == 1
        (s,) = found
        assert s["rank"] == 3 and s["localRank"] == 0 and s["inCollective"] is False
        line = next(
            i + 1
            for i, text in enumerate(script.read_text().splitlines())
            if "the line the dump names" in text
        )
        assert s["at"] == f"{script}:{line} in stuck_in_io"
        err = capsys.readouterr().err
        assert "stacks of a stalled rank" in err and "in stuck_in_io" in err
        assert proc.poll() is None  # the dump did not stop the worker
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_state_dir_reset_forgets_stack_dumps(tmp_path: Path) -> None:
    (tmp_path / "stacks-0.txt").write_text("old")
    (tmp_path / "rank-0.json").write_text("{}")
    state.reset_state_dir(str(tmp_path))
    assert not list(tmp_path.iterdir())


def test_a_reader_that_hung_up_leaves_no_traceback_in_the_training_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The operator's read gives up after 1 s; the launcher's answer then meets a closed
    socket. socketserver would print that as a traceback into the user's log."""
    server = status_server._StatusServer(("127.0.0.1", 0), status_server._StatusHandler)
    try:
        for err in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
            try:
                raise err
            except OSError:
                server.handle_error(None, ("127.0.0.1", 1))
        try:
            raise ValueError("something of ours")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
    finally:
        server.server_close()
    err_text = capsys.readouterr().err
    assert "Traceback" not in err_text
    assert "Broken pipe" not in err_text and "reset" not in err_text
    (line,) = err_text.strip().splitlines()
    assert line.startswith("[launcher] status request failed") and "something of ours" in line
