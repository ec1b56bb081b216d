"""`make demo`, the README's first command, as a newcomer runs it: the local cluster, the
operator and the CPU example, in a few lines that end with the job's per-rank status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dtj import REPO
from localkube.testing import pick_base, unique_cluster_name

# What a warm `make demo` prints (a cold one adds the build's 10 lines, test_build_output.py,
# and one each for the Debian packages and the venv): the README promises under 40 cold.
WARM_LINES = 27


@pytest.mark.timeout(600)
def test_make_demo_runs_the_example_to_succeeded_in_a_few_lines(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        LOCALKUBE_DIR=str(tmp_path / "cluster"),
        LOCALKUBE_NAME=unique_cluster_name("demo"),
        LOCALKUBE_BASE=str(pick_base()),
    )
    lk = [sys.executable, "-m", "localkube", "--dir", env["LOCALKUBE_DIR"]]
    # pytest's pythonpath does not reach a child: without this `down` said "No module named
    # localkube" and the demo cluster ran on through the rest of the suite.
    lk_env = dict(env, PYTHONPATH=os.pathsep.join(str(REPO / d) for d in ("cluster", "operator")))
    try:
        out = subprocess.run(
            ["make", "--no-print-directory", "demo"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=540,
        )  # fmt: skip
    finally:
        pid_file = tmp_path / "cluster" / "operator.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        down = subprocess.run(
            [*lk, "--name", env["LOCALKUBE_NAME"], "down"], env=lk_env, timeout=120,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert down.returncode == 0, f"the demo cluster is still up: {down.stdout[-2000:]}"
    text = out.stdout
    assert out.returncode == 0, text[-4000:]
    lines = text.splitlines()
    assert "Phase:      Succeeded" in lines, text
    assert lines[0].startswith("cluster demo") and " up in " in lines[0], text
    assert len(lines) <= WARM_LINES, text
