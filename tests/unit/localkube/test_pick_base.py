"""localkube.testing.pick_base: parallel sessions on one host (pytest-xdist's workers, the
fault campaign's runs) never get the same pod subnet, even when they pick at one moment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from localkube import network, testing


@pytest.fixture(autouse=True)
def no_interfaces(monkeypatch: pytest.MonkeyPatch) -> None:
    # The host's own bridges would make the picks depend on the machine.
    monkeypatch.setattr(network, "used_bases", lambda: set())


def test_picks_in_one_moment_never_share_a_base(tmp_path: Path) -> None:
    picks = [testing.pick_base(range(200, 205), claims=tmp_path) for _ in range(5)]
    assert sorted(picks) == [200, 201, 202, 203, 204]
    with pytest.raises(RuntimeError, match="no free"):
        testing.pick_base(range(200, 205), claims=tmp_path)


def test_a_base_used_by_an_interface_is_never_picked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(network, "used_bases", lambda: {200, 201})
    assert testing.pick_base(range(200, 203), claims=tmp_path) == 202


def test_a_dead_processs_claim_is_taken_over(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    (tmp_path / "200").write_text(dead.stdout.strip())
    assert testing.pick_base(range(200, 201), claims=tmp_path) == 200
    assert (tmp_path / "200").read_text() == str(os.getpid())


def test_an_expired_claim_is_taken_over(tmp_path: Path) -> None:
    claim = tmp_path / "200"
    claim.write_text(str(os.getppid()))  # alive, but its cluster is long up or long failed
    old = time.time() - testing.CLAIM_SECONDS - 1
    os.utime(claim, (old, old))
    assert testing.pick_base(range(200, 201), claims=tmp_path) == 200


def test_a_live_claim_of_another_process_is_respected(tmp_path: Path) -> None:
    (tmp_path / "200").write_text(str(os.getppid()))
    assert testing.pick_base(range(200, 202), claims=tmp_path) == 201


def test_processes_picking_together_get_distinct_bases(tmp_path: Path) -> None:
    # Eight processes released at one moment, over eight candidates: each gets its own. Each
    # lives on until all have picked (a claim lasts while its process does), as a session's
    # cluster outlives its pick.
    go, done = tmp_path / "go", tmp_path / "done"
    claims = tmp_path / "claims"
    script = (
        "import sys, time, pathlib\n"
        "from localkube import network, testing\n"
        "network.used_bases = lambda: set()\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.001)\n"
        f"print(testing.pick_base(range(200, 208), claims=pathlib.Path({str(claims)!r})),"
        " flush=True)\n"
        f"while not pathlib.Path({str(done)!r}).exists(): time.sleep(0.01)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(8)
    ]
    try:
        go.touch()
        picks = []
        for p in procs:
            assert p.stdout is not None
            picks.append(int(p.stdout.readline()))
    finally:
        done.touch()
        for p in procs:
            p.communicate(timeout=60)
    assert sorted(picks) == list(range(200, 208))
