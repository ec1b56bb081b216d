"""The worker shim runs a Python script in the worker process with the stack `python script.py`
gives it: one frame beneath the script's, with no source file, instead of the launcher's and
runpy's. Code that formats its own stack costs time per frame (torch.manual_seed does, through
torch.cuda's lazy-call queue, in every FakeData sample: bench/README.md), so frames beneath
the script slowed loader-bound training in the pods. The shim's other duties still hold: an
exception is recorded in torchelastic's error file, exit codes pass through, and the script is
``__main__``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchrun_operator.launcher import contract, stacks

# What the `entry_args` fixture gives (tests/unit/launcher/conftest.py): a worker's arguments
# from the shipped zipapp, and from the checkout's package.
EntryArgs = Callable[[list[str]], list[str]]

SCRIPT = textwrap.dedent(
    """
    import json, pickle, sys, traceback

    class Point:
        pass

    def inner():
        return [(f.filename, f.name) for f in traceback.extract_stack()]

    if __name__ == "__main__":
        frames = inner()
        main = sys.modules["__main__"]
        same = pickle.loads(pickle.dumps(Point())).__class__ is Point
        print(json.dumps({"frames": frames, "main_file": main.__file__, "pickles": same,
                          "argv": sys.argv}))
        if len(sys.argv) > 1:
            if sys.argv[1] == "raise":
                raise RuntimeError("boom")
            sys.exit(int(sys.argv[1]))
    """
)


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != contract.ENV_LOCAL_RANK_ARG}
    env.update(
        LOCAL_RANK="0",
        TORCHRUN_OPERATOR_STATE_DIR=str(tmp_path / "state"),
        TORCHELASTIC_ERROR_FILE=str(tmp_path / "error.json"),
    )
    return env


def _as_worker(
    tmp_path: Path, entry_args: EntryArgs, *args: str
) -> subprocess.CompletedProcess[str]:
    """The script as torchrun's agent starts it in a pod: the interpreter with the launcher's
    worker entry arguments."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, *entry_args(["python", str(script), *args])]
    return subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=60)


def _bare(tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    res = subprocess.run(
        [sys.executable, "-u", str(script)],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def test_the_script_has_the_stack_python_gives_it_plus_one_frame_without_source(
    tmp_path: Path, entry_args: EntryArgs
) -> None:
    bare = _bare(tmp_path)
    res = _as_worker(tmp_path, entry_args)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    # Beneath the script: the entry's own frame alone, whose source no traceback looks up.
    assert [tuple(f) for f in got["frames"]] == [
        ("<string>", "<module>"),
        *(tuple(f) for f in bare["frames"]),
    ]
    assert got["main_file"] == bare["main_file"] == str(tmp_path / "train.py")
    assert got["pickles"] and bare["pickles"]  # the script is __main__ for pickle
    assert got["argv"] == bare["argv"] == [str(tmp_path / "train.py")]
    # The worker registered itself (pid, stack dumps) for the launcher, as before.
    rank = json.loads((tmp_path / "state" / "rank-0.json").read_text())
    assert rank["stacks"].endswith("stacks-0.txt")


def test_an_exception_is_recorded_in_the_error_file(tmp_path: Path, entry_args: EntryArgs) -> None:
    res = _as_worker(tmp_path, entry_args, "raise")
    assert res.returncode == 1
    assert "RuntimeError: boom" in res.stderr
    record = json.loads((tmp_path / "error.json").read_text())["message"]
    assert record["message"] == "RuntimeError: boom"
    stack = record["extraInfo"]["py_callstack"]
    assert str(tmp_path / "train.py") in stack
    assert "torchrun_launcher" not in stack and "shim.py" not in stack


def test_exit_codes_pass_through_unrecorded(tmp_path: Path, entry_args: EntryArgs) -> None:
    assert _as_worker(tmp_path, entry_args, "0").returncode == 0
    assert _as_worker(tmp_path, entry_args, "3").returncode == 3
    assert not (tmp_path / "error.json").exists()


def test_a_missing_script_is_recorded(tmp_path: Path, entry_args: EntryArgs) -> None:
    cmd = [sys.executable, *entry_args(["python", str(tmp_path / "absent.py")])]
    res = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    record = json.loads((tmp_path / "error.json").read_text())["message"]
    assert record["message"].startswith("FileNotFoundError")


def test_a_module_runs_as_main_from_the_working_directory(
    tmp_path: Path, entry_args: EntryArgs
) -> None:
    """``python -m mod`` (run through runpy beneath the entry's frame): the module is
    ``__main__``, found from the working directory, with its file as argv[0]; its exception is
    recorded like a script's."""
    (tmp_path / "trainmod.py").write_text(
        "import sys\n"
        "print(__name__, sys.argv)\n"
        "if sys.argv[1:] == ['raise']:\n"
        "    raise ValueError('bad module')\n"
    )
    cmd = [sys.executable, *entry_args(["python", "-m", "trainmod", "ok"])]
    env = _env(tmp_path)
    res = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"__main__ [{str(tmp_path / 'trainmod.py')!r}, 'ok']"
    cmd = [sys.executable, *entry_args(["python", "-m", "trainmod", "raise"])]
    res = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    record = json.loads((tmp_path / "error.json").read_text())["message"]
    assert record["message"] == "ValueError: bad module"


def test_a_stalled_workers_stacks_still_name_the_scripts_line(
    tmp_path: Path, entry_args: EntryArgs
) -> None:
    """The stack dump (SIGUSR1, registered by the shim before the script runs) of a worker
    started through the entry: the launcher's summary names the script's line the main thread
    is stuck on, and the dump does not stop the worker."""
    sdir = tmp_path / "state"
    started = tmp_path / "started"
    script = tmp_path / "stuck.py"
    script.write_text(
        "import time\n"
        "def stuck_in_io():\n"
        f"    open({str(started)!r}, 'w').close()\n"
        "    time.sleep(60)  # the line the dump names\n"
        "stuck_in_io()\n"
    )
    env = {**_env(tmp_path), "RANK": "2"}
    proc = subprocess.Popen(
        [sys.executable, *entry_args(["python", str(script)])],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists()
        (summary,) = stacks.dump_worker_stacks(str(sdir), wait=5)
        assert summary["rank"] == 2 and summary["inCollective"] is False
        assert summary["at"] == f"{script}:4 in stuck_in_io"
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
