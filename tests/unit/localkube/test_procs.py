"""Process handling: health waits report the component's log, stop() ends what it started."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from localkube import procs


def test_failed_start_reports_exit_code_and_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "comp.log"
    proc = procs.start(
        [sys.executable, "-c", "print('line one'); print('fatal: bad flag'); raise SystemExit(3)"],
        log,
    )
    with pytest.raises(procs.ComponentError) as err:
        procs.wait_until("comp", lambda: False, proc, log, timeout=10)
    assert "exited with code 3" in str(err.value)
    assert "fatal: bad flag" in str(err.value)


def test_timeout_reports_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "comp.log"
    log.write_text("still starting\n")
    with pytest.raises(procs.ComponentError, match="still starting"):
        procs.wait_until("comp", lambda: False, None, log, timeout=0.3, interval=0.05)


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ok', flush=True); time.sleep(60)"
    )
    log = tmp_path / "stubborn.log"
    proc = procs.start([sys.executable, "-c", code, str(tmp_path)], log)
    procs.wait_until("stubborn", lambda: "ok" in log.read_text(), proc, log, timeout=10)
    assert procs.is_ours(proc.pid, str(tmp_path))
    procs.stop(proc.pid, grace=0.3)
    assert not procs.pid_alive(proc.pid)
    assert not procs.is_ours(proc.pid, str(tmp_path))


def test_free_ports_are_distinct() -> None:
    ports = procs.free_ports(7)
    assert len(set(ports)) == 7


def test_free_ports_stay_out_of_the_kernels_ephemeral_range() -> None:
    low, high = map(int, Path(procs.EPHEMERAL_RANGE_FILE).read_text().split())
    assert all(not low <= p <= high for p in procs.free_ports(20))


def test_listen_range_is_below_the_ephemeral_range_or_above_a_low_one(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("32768\t60999\n")
    assert procs.listen_range(str(f)) == range(10000, 32768)
    f.write_text("1024 40000\n")  # a range moved low: what is above it
    assert procs.listen_range(str(f)) == range(40001, 65536)
    assert procs.listen_range(str(tmp_path / "missing")) == range(10000, 32768)


def test_a_port_in_use_is_never_handed_out() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        busy.listen()
        with pytest.raises(OSError, match="no 1 free ports"):
            procs.free_ports(1, range(port, port + 1))
