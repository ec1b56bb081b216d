"""The tail of a worker's stderr for the report: torchrun's --tee file, cleaned and cut."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence

from .contract import STDERR_TAIL_LIMIT
from .torchrun_flags import flag_value

# Why torchrun's --tee: a worker that exits without an error file (argparse's exit 2, an
# exit(1) after logging, a segfault, a C++ abort) said why only on its stderr, and the
# report should quote it. Keeping a tail needs a copy of the stream somewhere. Any relay we
# put between the worker and the pod log (a thread or process reading a pipe) sits in the
# training process's write path: when it lags, the worker blocks on stderr; when it dies, the
# worker gets EPIPE. torchrun's tee instead points the worker's stderr at a plain file (a
# write never blocks on a reader) and its agent, in the launcher's process, copies new lines
# to the pod log every 0.1 s; the launcher reads the file's last bytes once, after the worker
# exited. The cost: stderr lines in the pod log carry torchrun's prefix ("[default0]:" or the
# --log-line-prefix-template), and the file grows with the worker's stderr (the pod's
# ephemeral storage: docs/pod-contract.md).

LOGS_DIR = "logs"  # in the state dir: torchrun's --log_dir unless the user gave one
# Read once, after the worker exited: enough for the line that says why to survive what a
# crash prints after it. Measured on 2 x H200 (torch 2.11, NCCL 2.28): an NCCL watchdog
# timeout's SIGABRT prints the watchdog line, then two C++ backtraces and faulthandler's dump,
# about 4 KiB, below it (bench/README.md, "GPU failures").
_STDERR_READ = 32 * STDERR_TAIL_LIMIT
# One line of the tail at most (its head says what kind of line it is, its end the message),
# so that one long line (a what() holding a whole message) cannot push every other line out.
_STDERR_LINE_LIMIT = 512
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# Lines that say nothing to a user and push the line that does out of the tail: c10's C++
# backtraces ("frame #3: <unknown function> + 0x9cb84 (0x7f... in .../libc.so.6)", under
# "Exception raised from run at .../ProcessGroupNCCL.cpp:2125 (most recent call first):") and
# faulthandler's list of loaded extension modules after a fatal signal.
_STDERR_NOISE = re.compile(
    r"^\s*(frame #\d+: |Exception raised from \S+ at \S+ \(most recent call first\):$"
    r"|Extension modules: )"
)


def _std_value(
    flags: Sequence[str], names: Sequence[str], env_name: str, env: Mapping[str, str]
) -> str:
    """torchrun's value of a -r/-t option: the last of ``--x v``, ``--x=v``, ``-xv`` (argparse's
    short form), else the environment's."""
    value = None
    for i, arg in enumerate(flags):
        if arg in names and i + 1 < len(flags):
            value = flags[i + 1]
        elif any(arg.startswith(n + "=") for n in names if n.startswith("--")):
            value = arg.split("=", 1)[1]
        elif any(arg.startswith(n) and len(arg) > len(n) for n in names if n[1] != "-"):
            value = arg[2:]
    return (value if value is not None else env.get(env_name, "")).strip() or "0"


def stderr_capture_flags(
    flags: Sequence[str], env: Mapping[str, str], default_log_dir: str
) -> tuple[list[str], str]:
    """torchrun ``flags`` that also tee every worker's stderr to a file (``--tee`` with the
    stderr bit added to what the user asked for), and the log dir those files are under
    (``--log-dir``: the user's, else ``default_log_dir``). A per-rank mapping or a
    ``--redirects`` of stderr is the user's choice and left as it is."""
    out = list(flags)
    log_dir = flag_value(flags, ("--log-dir", "--log_dir")) or env.get("PET_LOG_DIR", "")
    if not log_dir:
        log_dir = default_log_dir
        out += ["--log_dir", log_dir]  # torch 2.1 knows only this spelling for sure
    tee = _std_value(flags, ("-t", "--tee"), "PET_TEE", env)
    redirects = _std_value(flags, ("-r", "--redirects"), "PET_REDIRECTS", env)
    if tee in "0123" and len(tee) == 1 and redirects in ("0", "1") and not int(tee) & 2:
        out += ["--tee", str(int(tee) | 2)]
    return out, log_dir


def stderr_log_path(log_dir: str, local_rank: int) -> str | None:
    """The newest ``stderr.log`` of a local rank under torchrun's log dir
    (``<log dir>/<run id>_<random>/attempt_<n>/<local rank>/stderr.log`` in torch 2.1-2.x)."""
    pattern = os.path.join(
        glob.escape(log_dir), "*", "attempt_*", str(int(local_rank)), "stderr.log"
    )
    newest: tuple[float, str] | None = None
    for path in glob.glob(pattern):
        try:
            mtime = os.path.getmtime(path)
        except OSError:
            continue
        if newest is None or mtime > newest[0]:
            newest = (mtime, path)
    return newest[1] if newest else None


def _shorten(line: str, limit: int = _STDERR_LINE_LIMIT) -> str:
    if len(line) <= limit:
        return line
    half = (limit - 3) // 2
    return line[:half] + "..." + line[len(line) - (limit - 3 - half) :]


def clean_stderr_tail(data: bytes, partial_head: bool, limit: int = STDERR_TAIL_LIMIT) -> str:
    """The last whole lines of ``data`` (a stderr's end) in at most ``limit`` characters:
    decoded leniently, carriage-return progress bars and terminal colour codes turned into
    plain lines, other control characters dropped; C++ backtrace frames and faulthandler's
    module list dropped (_STDERR_NOISE), runs of blank lines made one, each line cut to
    _STDERR_LINE_LIMIT characters."""
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", _ANSI_ESCAPE.sub("", text))
    lines = text.split("\n")
    if partial_head and len(lines) > 1:
        lines = lines[1:]  # began mid-line
    lines = [_shorten(ln.rstrip()) for ln in lines if not _STDERR_NOISE.match(ln)]
    lines = [ln for i, ln in enumerate(lines) if ln or (i and lines[i - 1])]  # one blank line
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        if not line and not kept:
            continue  # trailing blank lines
        if size + len(line) + (1 if kept else 0) > limit:
            if not kept:
                kept.append(line[len(line) - limit :])  # one long line: its end
            break
        size += len(line) + (1 if kept else 0)
        kept.append(line)
    return "\n".join(reversed(kept)).strip("\n")


def read_stderr_tail(path: str | None, limit: int = STDERR_TAIL_LIMIT) -> str | None:
    """The tail of a worker's stderr file (see clean_stderr_tail), None if there is none."""
    if not path:
        return None
    try:
        with open(path, "rb") as fp:
            size = os.fstat(fp.fileno()).st_size
            start = max(0, size - _STDERR_READ)
            fp.seek(start)
            data = fp.read(_STDERR_READ)
    except OSError:
        return None
    return clean_stderr_tail(data, start > 0, limit) or None
