"""The worker shim passes --local-rank=<N> where torch.distributed.launch did: right after
the script, before the script's own arguments (spec.torchrun.localRankArg)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torchrun_operator.launcher import contract, shim


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        ("python t.py --lr 1", "python t.py ARG --lr 1"),
        ("python t.py", "python t.py ARG"),
        ("python -u t.py a", "python -u t.py ARG a"),
        ("python3 -m pkg.train a", "python3 -m pkg.train ARG a"),
        ("python -um pkg a", "python -um pkg ARG a"),
        ("python -mpkg a", "python -mpkg ARG a"),
        ("python -X dev -W ignore t.py a", "python -X dev -W ignore t.py ARG a"),
        ("python -Xdev t.py a", "python -Xdev t.py ARG a"),
        ("python -c code a", "python -c code ARG a"),
        ("/usr/bin/python3.11 t.py", "/usr/bin/python3.11 t.py ARG"),
        ("./run.sh a b", "./run.sh ARG a b"),
        ("bash -c x", "bash ARG -c x"),
    ],
)
def test_where_the_argument_goes(cmd: str, expected: str) -> None:
    out = shim.with_local_rank_arg(cmd.split(), "--local-rank", "3")
    assert out == expected.replace("ARG", "--local-rank=3").split()


def _run_worker(
    tmp_path: Path, launcher: Path, env_extra: dict[str, str], *cmd: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != contract.ENV_LOCAL_RANK_ARG}
    env.update(LOCAL_RANK="1", TORCHRUN_OPERATOR_STATE_DIR=str(tmp_path / "state"), **env_extra)
    return subprocess.run(
        [sys.executable, str(launcher), "--worker", "--", *cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


SCRIPT = textwrap.dedent(
    """
    import argparse, os, sys
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", "--local-rank", type=int, required=True)
    p.add_argument("--epochs", type=int)
    a = p.parse_args()
    assert a.local_rank == int(os.environ["LOCAL_RANK"]), (a, os.environ["LOCAL_RANK"])
    print("argv", sys.argv[1:], "epochs", a.epochs)
    """
)


@pytest.mark.parametrize("flag", ["--local-rank", "--local_rank"])
def test_a_launch_era_script_gets_its_argument(
    tmp_path: Path, launcher_pyz: Path, flag: str
) -> None:
    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    res = _run_worker(
        tmp_path,
        launcher_pyz,
        {contract.ENV_LOCAL_RANK_ARG: flag},
        "python",
        str(script),
        "--epochs",
        "2",
    )
    assert res.returncode == 0, res.stderr
    assert f"argv ['{flag}=1', '--epochs', '2'] epochs 2" in res.stdout


def test_without_the_setting_the_script_gets_none(tmp_path: Path, launcher_pyz: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    res = _run_worker(tmp_path, launcher_pyz, {}, "python", str(script))
    assert res.returncode == 2
    assert "required" in res.stderr
