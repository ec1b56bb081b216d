"""The worker shim: runs inside every torchrun worker process, registers the worker for the
launcher and runs the user's command as `python script.py` (or `-m module`) would.
"""

from __future__ import annotations

import errno
import faulthandler
import json
import os
import re
import sys
import threading
import time
import traceback
import types
from collections.abc import Sequence
from typing import Any

from .contract import ENV_LOCAL_RANK_ARG, ENV_RESUME_FROM, READY_FILE, RESUME_FILE
from .frames import raised_at
from .logline import log
from .progress_file import MAX_CHECKPOINT_PATH
from .stacks import register_stack_dump
from .state import compact_json, state_dir, write_atomic

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
_IGNORED_PYTHON_FLAGS = {"-u", "-B"}


def python_target(cmd: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """If ``cmd`` is ``python [-u] script.py args`` or ``python [-u] -m mod args``, return
    ("path"|"module", target, argv-tail); otherwise None (the command is exec'd)."""
    if not cmd or not _PYTHON_NAME.match(os.path.basename(cmd[0])):
        return None
    i = 1
    while i < len(cmd) and cmd[i] in _IGNORED_PYTHON_FLAGS:
        i += 1
    if i >= len(cmd):
        return None
    if cmd[i] == "-m":
        if i + 1 >= len(cmd):
            return None
        return ("module", cmd[i + 1], list(cmd[i + 2 :]))
    if cmd[i].startswith("-"):
        return None  # -c, -X, -W ...: let the real interpreter handle them
    return ("path", cmd[i], list(cmd[i + 1 :]))


def local_rank_arg_index(cmd: Sequence[str]) -> int:
    """Where torch.distributed.launch put --local-rank: right after the script (or the module
    of ``python -m``, the code of ``python -c``), before the script's own arguments; right
    after the program of a command that is not Python."""
    if not cmd or not _PYTHON_NAME.match(os.path.basename(cmd[0])):
        return min(1, len(cmd))
    i = 1
    while i < len(cmd):
        tok = cmd[i]
        if not tok.startswith("-") or tok == "-":
            return i + 1  # the script (or "-", stdin)
        if tok.startswith("--"):
            i += 2 if tok == "--check-hash-based-pycs" else 1
            continue
        skip_next = False
        for j in range(1, len(tok)):  # short options, possibly run together: -u, -um mod
            if tok[j] in "mc":
                return i + 1 if j + 1 < len(tok) else min(i + 2, len(cmd))
            if tok[j] in "WX":
                skip_next = j + 1 == len(tok)
                break
        i += 2 if skip_next else 1
    return len(cmd)


def with_local_rank_arg(cmd: Sequence[str], flag: str, local_rank: str) -> list[str]:
    """``cmd`` with ``<flag>=<local_rank>`` where torch.distributed.launch put it."""
    i = local_rank_arg_index(cmd)
    return [*cmd[:i], f"{flag}={local_rank}", *cmd[i:]]


def error_file_payload(e: BaseException, tb: str, now: float) -> dict[str, Any]:
    """torchelastic's error-file JSON, as ``errors.record`` writes it (timestamp: int seconds
    as a string, which torchelastic parses); ``timestampPrecise`` and ``location`` (where the
    user's code raised ``e``, launcher/frames.py) are our additions."""
    extra = {
        "py_callstack": tb,
        "timestamp": str(int(now)),
        "timestampPrecise": f"{now:.3f}",
    }
    try:
        location = raised_at(e)
    except Exception as le:  # noqa: BLE001 - the error is recorded without its place
        log("worker: cannot tell where the error was raised", error=le)
        location = None
    if location:
        extra["location"] = location
    return {"message": {"message": f"{type(e).__name__}: {e}", "extraInfo": extra}}


def _record_worker_state(sdir: str, stacks: str | None = None) -> None:
    env = os.environ
    local_rank = env.get("LOCAL_RANK", "0")
    record: dict[str, Any] = {
        "rank": int(env.get("RANK", "-1")),
        "localRank": int(local_rank),
        "groupRank": int(env.get("GROUP_RANK", "-1")),
        "worldSize": int(env.get("WORLD_SIZE", "0")),
        "restartCount": int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "pid": os.getpid(),
        "thread": threading.main_thread().ident,
    }
    if stacks:
        record["stacks"] = stacks  # SIGUSR1 dumps this worker's stacks there
    try:
        os.makedirs(sdir, exist_ok=True)
        write_atomic(os.path.join(sdir, f"rank-{local_rank}.json"), compact_json(record))
        # The shim only runs once rendezvous completed: this worker exists => training started.
        write_atomic(os.path.join(sdir, READY_FILE), compact_json(record) + "\n")
    except OSError as e:
        log("cannot write worker state", dir=sdir, error=e)


# How torchrun's agent starts each worker: ``python -u -c WORKER_BOOTSTRAP <package root>
# <this module's name> --worker <command...>``. The bootstrap imports this module from the
# launcher's package root (the zipapp in a pod: zipimport), takes that root off sys.path again,
# and runs the user's script from its own top level, so the script's frames sit on one frame
# with no source file, as under ``python script.py`` they sit on none. Frames beneath the
# script are not free: code that formats its own stack pays for each (torch.manual_seed does,
# in torch.cuda's lazy-call queue, once per FakeData sample), and the launcher's and runpy's
# seven made a loader-bound tutorial script 1.2-1.5x slower in the pods (bench/README.md).
# Everything the shim needs is imported at its top, before its root leaves sys.path.
WORKER_BOOTSTRAP = (
    "import importlib,sys\n"
    "p=sys.argv[1];sys.path.insert(0,p);m=importlib.import_module(sys.argv[2]);sys.path.remove(p)\n"
    "try:c,g=m.worker_code(sys.argv[4:]);exec(c,g)\n"
    "except Exception as e:sys.exit(m.worker_failed(e))\n"
)


def package_root() -> str:
    """The sys.path entry this package is imported from: the zipapp in a pod (its modules'
    paths are ``<archive>/torchrun_launcher/<module>.py``), ``operator/`` in a checkout."""
    root = os.path.abspath(__file__)
    for _ in __name__.split("."):
        root = os.path.dirname(root)
    return root


def worker_entry_args(cmd: list[str]) -> list[str]:
    """The interpreter's arguments for one worker (torchrun's agent starts sys.executable)."""
    return ["-u", "-c", WORKER_BOOTSTRAP, package_root(), __name__, "--worker", *cmd]


def worker_code(cmd: list[str]) -> tuple[Any, dict[str, Any]]:
    """In a worker: register it for the launcher, then either exec a program that is not
    Python (never returns) or return the user's Python code and the globals to run it in, with
    sys.argv, sys.path and ``__main__`` as ``python script.py`` (or ``-m module``) sets them."""
    if not cmd:
        log("worker: no command")
        sys.exit(2)
    sdir = state_dir()
    stacks = None
    if python_target(cmd) is not None:
        # Only a Python worker can dump its stacks: SIGUSR1 would kill any other program.
        os.makedirs(sdir, exist_ok=True)
        stacks = register_stack_dump(sdir, os.environ.get("LOCAL_RANK", "0"))
    _record_worker_state(sdir, stacks)
    resume = resume_from(sdir)
    if resume is not None:
        os.environ[ENV_RESUME_FROM] = resume
    local_rank_arg = os.environ.get(ENV_LOCAL_RANK_ARG, "")
    if local_rank_arg.startswith("--"):
        # spec.torchrun.localRankArg: a launch-era script's argparse requires it.
        cmd = with_local_rank_arg(cmd, local_rank_arg, os.environ.get("LOCAL_RANK", "0"))
    elif local_rank_arg:
        log("worker: ignoring invalid local rank argument", value=local_rank_arg)
    target = python_target(cmd)
    if target is None:
        try:
            os.execvp(cmd[0], cmd)
        except OSError as e:
            log("worker: cannot exec", command=cmd[0], error=e)
            sys.exit(127 if e.errno == errno.ENOENT else 126)
    assert target is not None
    kind, what, rest = target
    faulthandler.enable(all_threads=True)
    sys.argv = [what, *rest]  # run_module replaces argv[0] with the module's file
    if kind == "module":
        sys.path[0] = os.getcwd()
        code = f"import runpy\nrunpy.run_module({what!r}, run_name='__main__', alter_sys=True)\n"
        return compile(code, "<torchrun-operator>", "exec"), {"__name__": "__torchrun_operator__"}
    # As `python script.py` would: the script's directory first on sys.path, replacing the
    # launcher's own directory; a fresh __main__ module whose globals the script runs in.
    sys.path[0] = os.path.dirname(os.path.abspath(what))
    with open(what, "rb") as fp:
        source = fp.read()
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=what, __cached__=None, __loader__=None, __package__=None)
    sys.modules["__main__"] = main
    # dont_inherit: this file's `from __future__` imports are not the script's.
    return compile(source, what, "exec", dont_inherit=True), main.__dict__


def resume_from(sdir: str) -> str | None:
    """The checkpoint a worker resumes from: the latest this pod's launcher saw its script
    report (an in-pod restart), else none here (the pod's environment keeps the one the
    operator rendered from status.lastCheckpoint)."""
    try:
        with open(os.path.join(sdir, RESUME_FILE), encoding="utf-8") as fp:
            path = fp.read(MAX_CHECKPOINT_PATH + 1)
    except OSError:
        return None
    return path if 0 < len(path) <= MAX_CHECKPOINT_PATH else None


def worker_failed(e: BaseException) -> int:
    """A worker's script raised: record it in torchelastic's error file, as ``errors.record``
    would, and print the traceback. Returns the exit code."""
    now = time.time()
    tb = traceback.format_exc()
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        try:
            with open(path, "w") as fp:
                json.dump(error_file_payload(e, tb, now), fp)
        except OSError as we:
            log("worker: cannot write error file", path=path, error=we)
    sys.stderr.write(tb)
    sys.stderr.flush()
    return 1


def worker_main(cmd: list[str]) -> int:
    """``launcher.pyz --worker <command...>`` run directly (not how the agent starts workers:
    see WORKER_BOOTSTRAP): the same shim, beneath the launcher's frames."""
    try:
        code, run_globals = worker_code(cmd)
        exec(code, run_globals)  # noqa: S102 - the user's script, as python would run it
    except SystemExit as se:
        # Like errors.record: exit(0) is success; other exits are passed through unrecorded.
        if se.code is None or se.code == 0:
            return 0
        raise
    except Exception as e:  # noqa: BLE001 - recorded for the launcher's report
        return worker_failed(e)
    return 0
