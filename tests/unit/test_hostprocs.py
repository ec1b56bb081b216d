"""tests/integration/hostprocs.py: what it reads from this host's /proc about a real process."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / d) for d in ("tests/integration", "operator", "cluster")]

from hostprocs import stopped  # noqa: E402
from localkube.testing import wait_for  # noqa: E402


def test_stopped_follows_sigstop_and_sigcont_and_a_process_gone_is_not(tmp_path: Path) -> None:
    # A command named ") T (" (the name of the path it was run by): the state is read after
    # the last parenthesis, not the first.
    exe = tmp_path / ") T ("
    exe.symlink_to(shutil.which("sleep") or "/bin/sleep")
    proc = subprocess.Popen([str(exe), "60"])
    comm = Path(f"/proc/{proc.pid}/comm")
    try:
        # Popen returns once the exec closed its error pipe, which the kernel does before it
        # renames the process: under load the name is still python's for a moment.
        wait_for("the exec to rename the process", lambda: comm.read_text() == ") T (\n", 10)
        assert not stopped(proc.pid)
        proc.send_signal(signal.SIGSTOP)
        wait_for("the process to stop", lambda: stopped(proc.pid), 10, interval=0.05)
        proc.send_signal(signal.SIGCONT)
        wait_for("the process to go on", lambda: not stopped(proc.pid), 10, interval=0.05)
    finally:
        proc.kill()
        proc.wait()
    assert not stopped(proc.pid)
