"""examples/scripts/train_checkpoint.py across attempts (docs/progress.md, "Checkpoints across
attempts"): an earlier attempt's pods may still run on a partitioned node and write to the
same storage, and a pod may die mid-save. Each attempt writes its own files, under temporary
names of its own, and completes each checkpoint with a marker; only a complete checkpoint is
resumed from."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[3] / "examples" / "scripts"
torch = pytest.importorskip("torch")
sys.path.insert(0, str(SCRIPTS))
import train_checkpoint as tc  # noqa: E402


def state(step: int, value: float) -> dict[str, Any]:
    return {"step": step, "model": {"w": torch.full((4,), value)}, "optimizer": {}}


def weight(path: str) -> float:
    return float(torch.load(path, weights_only=True)["model"]["w"][0])


def test_two_attempts_saving_the_same_step_do_not_clobber_each_other(tmp_path: Path) -> None:
    d = str(tmp_path)
    new = tc.save(d, 10, 1, 0, state(10, 1.0))
    # Attempt 0's rank 0, still running on a partitioned node, saves its step 10 later.
    old = tc.save(d, 10, 0, 0, state(10, 0.0))
    assert new != old
    assert tc.complete(new) and tc.complete(old)
    assert (weight(new), weight(old)) == (1.0, 0.0)
    assert tc.resume_path(d, new) == new
    # No temporary file is left behind, and each had a name no other writer uses.
    assert sorted(os.listdir(d)) == sorted(
        [os.path.basename(p) + s for p in (new, old) for s in ("", tc.MARKER)]
    )


def test_a_torn_checkpoint_is_never_resumed_from(tmp_path: Path) -> None:
    d = str(tmp_path)
    good = tc.save(d, 10, 0, 0, state(10, 1.0))
    # Died after the rename, before the marker: no marker.
    unmarked = tc.save(d, 20, 0, 0, state(20, 2.0))
    os.remove(unmarked + tc.MARKER)
    assert not tc.complete(unmarked)
    assert tc.resume_path(d, unmarked) == good
    # A file that is not the one its marker describes (cut short, or written over by a
    # writer of the same name) is torn too.
    cut = tc.save(d, 20, 1, 0, state(20, 3.0))
    with open(cut, "r+b") as fp:
        fp.truncate(os.path.getsize(cut) // 2)
    assert not tc.complete(cut)
    assert tc.resume_path(d, cut) == good
    # Never a later checkpoint than the one the operator named (it was never reported) ...
    later = tc.save(d, 30, 1, 0, state(30, 4.0))
    assert tc.complete(later) and tc.resume_path(d, cut) == good
    # ... and with nothing complete at or before it, from step 0.
    os.remove(good + tc.MARKER)
    assert tc.resume_path(d, cut) is None
    assert tc.resume_path(d, "") is None  # told nothing: nothing to resume


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_the_script_resumes_from_the_last_complete_checkpoint(tmp_path: Path) -> None:
    # The whole script, one gloo process on the CPU, as attempt 1 of a job told to resume
    # from a checkpoint attempt 0 left torn.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    good = tc.save(str(ckpt), 4, 0, 0, _model_state(4))
    torn = tc.save(str(ckpt), 8, 0, 0, _model_state(8))
    os.remove(torn + tc.MARKER)
    env = {
        **os.environ,
        "PYTHONPATH": str(SCRIPTS),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "CUDA_VISIBLE_DEVICES": "",
        "TORCHRUN_OPERATOR_CHECKPOINT_DIR": str(ckpt),
        "TORCHRUN_OPERATOR_ATTEMPT": "1",
        "TORCHRUN_OPERATOR_RESUME_FROM": torn,
    }
    steps = tmp_path / "steps.log"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "train_checkpoint.py"), "--steps", "8", "--save-every", "4"]
        + ["--step-log", str(steps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"resumed from {good} at step 4" in done.stdout
    assert steps.read_text().split() == ["start", "4", "5", "6", "7", "8"]
    # Its own step 8 is attempt 1's file, complete; attempt 0's torn one is left as it was.
    mine = str(ckpt / "step-8.a1.pt")
    assert tc.complete(mine) and not tc.complete(torn)


def _model_state(step: int) -> dict[str, Any]:
    """A checkpoint of the script's own model (nn.Linear(16, 1) and SGD) at `step`."""
    torch.manual_seed(step)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}
