"""torchrun-operator in-pod launcher.

Usage (as the operator renders it, see docs/pod-contract.md):

    python /opt/torchrun-operator/launcher.py <torchrun flags> -- <user command...>

The launcher is PID 1 of the trainer container. It waits (bounded) until the rendezvous host name
resolves, runs torchrun through its Python API with itself as the worker entrypoint
(``launcher.py --worker <user command>``), and writes a compact JSON summary of this node's
ranks to the termination-message file, where the operator reads it. While it runs, it serves
what it knows (its node rank and global ranks once rendezvous completed, the script's progress,
the stacks of a stalled rank) read-only at ``GET /status`` on the status port, where the
operator reads it.

This file is mounted from a ConfigMap into arbitrary images: it depends on nothing but the
standard library and torch, and torch is imported lazily so ``--help`` and the pure helpers
work without it.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import glob
import http.server
import json
import math
import os
import re
import shutil
import signal
import socket
import stat
import sys
import sysconfig
import threading
import time
import traceback
import types
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, TypedDict

# ==========================================================================================
# The pod contract (docs/pod-contract.md)
#
# Everything the renderer puts into a training pod for the launcher, and everything the
# launcher hands back to the operator, is named here and nowhere else: render/pod.py,
# reconcile/ and kube/rankmap.py import these names (`from ..launcher import launcher as
# contract`). The launcher itself imports nothing of ours, so it still runs as this one file
# mounted into any image.

# Where the launcher's ConfigMap is mounted, and the launcher's file name in it.
LAUNCHER_DIR = "/opt/torchrun-operator"
LAUNCHER_FILE = "launcher.py"
# The launcher's state dir (an emptyDir) and the files in it the operator relies on.
STATE_DIR = "/var/run/torchrun"
READY_FILE = "ready"  # exists while the node trains: the readiness probe cats it
STALLED_FILE = "stalled"  # the progress watch's marker while readiness is withdrawn
RESUME_FILE = "resume-from"  # the latest checkpoint path the script reported, for restarts
PROGRESS_FILE = "progress"  # where the renderer points the training script's step counter
# The termination message: the report below, compact JSON of at most TERMINATION_LIMIT bytes.
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LIMIT = 4096
SUMMARY_VERSION = 1
# The read-only status endpoint: GET STATUS_PATH on STATUS_PORT of the pod IP.
STATUS_PORT = 29401
STATUS_PORT_NAME = "torchrun-status"
STATUS_PATH = "/status"
LIVE_VERSION = 1

# Environment the renderer sets and the launcher reads.
ENV_STATE_DIR = "TORCHRUN_OPERATOR_STATE_DIR"
ENV_DNS_TIMEOUT = "TORCHRUN_OPERATOR_DNS_TIMEOUT"
ENV_TERMINATION_LOG = "TORCHRUN_OPERATOR_TERMINATION_LOG"  # tests only: the renderer never sets it
ENV_PROGRESS_FILE = "TORCHRUN_OPERATOR_PROGRESS_FILE"
ENV_PROGRESS_TIMEOUT = "TORCHRUN_OPERATOR_PROGRESS_TIMEOUT"
ENV_INDEX = "TORCHRUN_OPERATOR_INDEX"
ENV_NODE_RANK = "TORCHRUN_OPERATOR_NODE_RANK"  # the index's deprecated name
ENV_LOCAL_RANK_ARG = "TORCHRUN_OPERATOR_LOCAL_RANK_ARG"
ENV_STATUS_PORT = "TORCHRUN_OPERATOR_STATUS_PORT"
ENV_PROGRESS_WINDOW = "TORCHRUN_OPERATOR_PROGRESS_WINDOW"
# spec.checkpoint (docs/progress.md, "Checkpoints"): the mounted storage, and the latest
# checkpoint a script reported (the operator renders it from status.lastCheckpoint; the
# launcher passes a newer one it saw itself to the workers of an in-pod restart).
ENV_CHECKPOINT_DIR = "TORCHRUN_OPERATOR_CHECKPOINT_DIR"
ENV_RESUME_FROM = "TORCHRUN_OPERATOR_RESUME_FROM"

# States of the report (the termination message).
SUCCEEDED = "Succeeded"
FAILED = "Failed"
RENDEZVOUS_TIMEOUT = "RendezvousTimeout"
DNS_TIMEOUT = "DNSTimeout"
ERROR = "Error"  # a launcher bug or bad arguments

# States of the status endpoint's answer, in the order a launcher goes through them.
LIVE_STARTING = "Starting"  # launcher up, DNS wait
LIVE_RENDEZVOUS = "Rendezvous"  # the agent is in a rendezvous round
LIVE_TRAINING = "Training"  # a round completed: workers run
LIVE_STALLED = "Stalled"  # the progress watch withdrew readiness
LIVE_FINISHED = "Finished"  # the report is written

# Failure kinds of one worker, most telling first: the order decides which failure names the
# exit code and which failures survive when the report must drop some to fit. A communication
# error is always a consequence of some other failure, so it comes last.
FailureKind = Literal["exception", "exit", "signal", "comm"]
KIND_EXCEPTION: Final = "exception"  # the worker recorded an error
KIND_EXIT: Final = "exit"  # a non-zero exit, nothing recorded
KIND_SIGNAL: Final = "signal"  # killed by a signal, nothing recorded
KIND_COMM: Final = "comm"  # the recorded error is a communication failure
KIND_ORDER: tuple[FailureKind, ...] = (KIND_EXCEPTION, KIND_EXIT, KIND_SIGNAL, KIND_COMM)


class _FailureRequired(TypedDict):
    rank: int  # global rank
    localRank: int
    exitCode: int
    kind: FailureKind
    error: str
    at: float  # unix seconds, the worker's own clock when it recorded the error


class FailureRecord(_FailureRequired, total=False):
    """One failed worker in the report."""

    # Only when the worker recorded no error (kinds exit and signal): the last lines of its
    # stderr, at most STDERR_TAIL_LIMIT characters (argparse's usage error, a log line before
    # sys.exit(1), faulthandler's dump of a segfault).
    stderr: str


STDERR_TAIL_LIMIT = 2048


class _SummaryRequired(TypedDict):
    v: int
    state: str  # SUCCEEDED, FAILED, RENDEZVOUS_TIMEOUT, DNS_TIMEOUT or ERROR
    groupRank: int | None  # torchrun's node rank; None when no worker started
    ranks: list[int]  # this node's workers' global ranks
    restarts: int  # torchrun's in-pod restarts
    failures: list[FailureRecord]  # most telling first


class Summary(_SummaryRequired, total=False):
    """The report the launcher writes to the termination message (docs/pod-contract.md)."""

    message: str  # why, when no worker failure says it
    step: int  # the last step the script wrote to the progress file
    round: int  # the rendezvous round groupRank and ranks are from
    omitted: int  # failures dropped to stay under TERMINATION_LIMIT
    checkpoint: dict[str, Any]  # the latest checkpoint the script reported: {step, path}
    # After a communication failure: the ranks of this node found outside any collective
    # (`{"rank", "inCollective": false, "at"?}`), the ones the others waited for.
    stacks: list[dict[str, Any]]


# Errors that say "a peer went away or the network failed" rather than "this code raised": a
# worker's recorded error or an agent's message. They are consequences of another rank's
# failure, never the root cause. The operator classifies agent messages with the same list.
COMM_PATTERNS = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"connection (closed|reset|refused|timed out)",
        r"closed by peer",
        r"reset by peer",
        r"broken pipe",
        r"\bDist(Network|Backend|Store)Error\b",
        r"\bRendezvous(Connection|Closed)Error\b",
        r"connection to the C10d store",
        r"\bsocket timeout\b",
        r"gloo.*(timed out|timeout|abort)",
        r"(timed out|timeout).*gloo",
        r"\bNCCL\b.*(timed out|timeout|abort|remote|system error|unhandled|error)",
        r"watchdog caught collective operation timeout",
        r"ProcessGroupNCCL",
        r"communicator was aborted",
        r"\bECONNRESET\b|\bEPIPE\b",
    )
]


def is_comm_error(text: str) -> bool:
    return any(p.search(text) for p in COMM_PATTERNS)


# End of the pod contract.
# ==========================================================================================

DEFAULT_DNS_TIMEOUT = 300.0
DNS_LOG_INTERVAL = 5.0
DEFAULT_PROGRESS_WINDOW = 60.0
# How long the launcher waits for its workers' stack dumps when training stalls.
STACK_DUMP_WAIT = 3.0
# Stack frames in these files mean "waiting in a collective".
_COLLECTIVE_PATHS = ("/torch/distributed/", "/torch/nn/parallel/")

USAGE = f"""\
usage: python launcher.py <torchrun flags> -- <command> [args...]
       python launcher.py --worker <command> [args...]   (internal: torchrun's entrypoint)

Runs torchrun (torch.distributed.run flags, PET_* env also accepted) with <command> as the
program of every worker, and writes a JSON summary to the termination-message file.

environment:
  {ENV_STATE_DIR}: state dir, holds 'ready' and 'rank-<local rank>.json'
      (default {STATE_DIR})
  {ENV_DNS_TIMEOUT}: seconds to wait for the rendezvous host to resolve
      (default {DEFAULT_DNS_TIMEOUT:g})
  {ENV_TERMINATION_LOG}: where the JSON summary goes (default {TERMINATION_LOG})
  {ENV_PROGRESS_FILE}: optional file a training script writes its step number to
  {ENV_PROGRESS_TIMEOUT}: optional seconds; when the progress file has not changed for this
      long after rendezvous, 'ready' is removed (the pod turns NotReady) and 'stalled' written
  {ENV_LOCAL_RANK_ARG}: optional --local-rank or --local_rank; each worker's script then gets
      <that>=<LOCAL_RANK> right after it, as torch.distributed.launch passed it
  {ENV_STATUS_PORT}: port of the read-only GET {STATUS_PATH} endpoint (default
      {STATUS_PORT}; 0: none)
  {ENV_PROGRESS_WINDOW}: seconds steps per second and step time are averaged over
      (default {DEFAULT_PROGRESS_WINDOW:g})
"""


# ------------------------------------------------------------------------------------------
# logging


def log(message: str, **fields: Any) -> None:
    """One structured line on stderr: ``[launcher] message key=value ...``."""
    extra = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items())
    line = f"[launcher] {message}" + (f" {extra}" if extra else "")
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _fmt(v: Any) -> str:
    s = str(v)
    if not s or '"' in s or any(c.isspace() for c in s):
        return json.dumps(s, ensure_ascii=False)
    return s


# ------------------------------------------------------------------------------------------
# pure helpers: classification, truncation, summary


def classify_failure(exitcode: int, recorded_error: str | None) -> FailureKind:
    """Kind of one worker failure.

    A worker that raised may exit 1 or -6 (unclean gloo/NCCL teardown) at random, so the
    recorded error decides, not the exit code.
    """
    if recorded_error:
        return KIND_COMM if is_comm_error(recorded_error) else KIND_EXCEPTION
    if exitcode < 0:
        return KIND_SIGNAL
    return KIND_EXIT


def truncate_text(text: str, limit: int) -> str:
    """Shorten ``text`` to at most ``limit`` characters.

    Keeps mostly the end: a traceback's last lines hold the exception, which is what a user
    needs; a little of the head stays too, since an exception message starts with its type.
    """
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    marker = " … "
    if limit <= len(marker) + 2:
        return text[-limit:]
    room = limit - len(marker)
    head = room // 4
    tail = room - head
    return text[:head] + marker + text[len(text) - tail :]


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _size(obj: Any) -> int:
    return len(_dumps(obj).encode("utf-8"))


def failure_sort_key(f: Mapping[str, Any]) -> tuple[int, float, int]:
    kind = f.get("kind", KIND_EXIT)
    order = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    return (order, float(f.get("at") or 0.0), int(f.get("rank", 0)))


def fit_summary(summary: Mapping[str, Any], limit: int = TERMINATION_LIMIT) -> dict[str, Any]:
    """Return a copy of ``summary`` whose compact JSON is at most ``limit`` bytes.

    Messages are shortened first (evenly, keeping their tails); only if the bare records still
    don't fit are the least telling failures dropped, counted in ``omitted``. The JSON itself
    is never cut.
    """
    out = dict(summary)
    failures = [dict(f) for f in summary.get("failures", [])]
    failures.sort(key=failure_sort_key)
    out["failures"] = failures
    if _size(out) <= limit:
        return out

    originals = [str(f.get("error") or "") for f in failures]
    tails = [str(f.get("stderr") or "") for f in failures]
    top = str(summary.get("message") or "")

    def shorten(budget: int) -> bool:
        for f, err, tail in zip(failures, originals, tails, strict=True):
            if "error" in f:
                f["error"] = truncate_text(err, budget)
            if tail:  # a stderr tail shrinks like the error (keeping its end), or goes
                f["stderr"] = truncate_text(tail, budget)
                if not f["stderr"]:
                    del f["stderr"]
        if "message" in out:
            out["message"] = truncate_text(top, max(budget, 256))
        return _size(out) <= limit

    # 1. Shorten every message evenly, down to a length that still names the error.
    budget = max(len(top), *(len(e) for e in originals), *(len(t) for t in tails), 1)
    floor = 160
    while budget > floor:
        budget = max(budget // 2, floor)
        if shorten(budget):
            return out
    # 2. Many ranks on this node: drop the least telling failures, counted in "omitted".
    omitted = 0
    while len(failures) > 1 and _size(out) > limit:
        failures.pop()
        originals.pop()
        tails.pop()
        omitted += 1
        out["omitted"] = omitted
    if _size(out) <= limit:
        return out
    # 3. Pathological (huge ranks list or message): shrink to nothing, then drop the rest.
    out.pop("stacks", None)
    for budget in (80, 32, 0):
        if shorten(budget):
            return out
    out["message"] = truncate_text(top, 64) if top else None
    if not out["message"]:
        out.pop("message", None)
    while failures and _size(out) > limit:
        failures.pop()
        omitted += 1
        out["omitted"] = omitted
    if _size(out) > limit:  # a checkpoint path of 1024 escaped characters can be 6 KiB
        out.pop("checkpoint", None)
    if _size(out) > limit:
        out["ranks"] = []
    return out


def build_summary(
    state: str,
    *,
    group_rank: int | None = None,
    ranks: Sequence[int] = (),
    restarts: int = 0,
    failures: Sequence[FailureRecord] = (),
    message: str | None = None,
    step: int | None = None,
    checkpoint: Mapping[str, Any] | None = None,
    stacks: Sequence[Mapping[str, Any]] = (),
) -> Summary:
    summary: Summary = {
        "v": SUMMARY_VERSION,
        "state": state,
        "groupRank": group_rank,
        "ranks": sorted(int(r) for r in ranks),
        "restarts": int(restarts),
        "failures": [f.copy() for f in failures],
    }
    if message:
        summary["message"] = message
    if step is not None:
        summary["step"] = step
    if checkpoint is not None:
        summary["checkpoint"] = {"step": checkpoint["step"], "path": checkpoint["path"]}
    if stacks:
        summary["stacks"] = [dict(s) for s in stacks]
    return summary


def encode_summary(summary: Mapping[str, Any], limit: int = TERMINATION_LIMIT) -> bytes:
    data = _dumps(fit_summary(summary, limit)).encode("utf-8")
    if len(data) > limit:  # cannot happen unless limit is absurdly small; never emit broken JSON
        data = _dumps({"v": SUMMARY_VERSION, "state": summary.get("state", ERROR)}).encode()
    return data


# torchelastic's placeholders when a worker left no error file (ProcessFailure fills
# error_file_data with {"message": "<NONE>"}).
_NO_RECORD = {"", "<NONE>", "<N/A>"}


def error_text_from_record(error_file_data: Any) -> str | None:
    """The recorded error of a torchelastic error file, or None when nothing was recorded."""
    if not isinstance(error_file_data, Mapping):
        return None
    msg = error_file_data.get("message")
    if isinstance(msg, Mapping):
        msg = msg.get("message")
    if isinstance(msg, str) and msg.strip() not in _NO_RECORD:
        return msg
    return None


def precise_timestamp(error_file_data: Any, fallback: float) -> float:
    if isinstance(error_file_data, Mapping):
        msg = error_file_data.get("message")
        if isinstance(msg, Mapping):
            extra = msg.get("extraInfo") or {}
            for key in ("timestampPrecise", "timestamp"):
                try:
                    return float(extra[key])
                except (KeyError, TypeError, ValueError):
                    continue
    return float(fallback)


def failure_record(
    rank: int,
    local_rank: int,
    exitcode: int,
    error_file_data: Any,
    fallback_message: str,
    timestamp: float,
    stderr: str | None = None,
) -> FailureRecord:
    """One failed worker; ``stderr`` (the tail of its stderr) is kept only when the worker
    recorded no error, the only case where it says what the error file does not."""
    recorded = error_text_from_record(error_file_data)
    kind = classify_failure(exitcode, recorded)
    if recorded:
        error = recorded
    elif exitcode < 0:
        error = fallback_message or f"killed by signal {-exitcode}"
    else:
        # torchelastic's placeholder ("To enable traceback see: ...") tells the user nothing.
        error = f"exited with code {exitcode} without recording an error"
    record: FailureRecord = {
        "rank": int(rank),
        "localRank": int(local_rank),
        "exitCode": int(exitcode),
        "kind": kind,
        "error": error,
        "at": round(precise_timestamp(error_file_data, timestamp), 3),
    }
    if stderr and not recorded:
        record["stderr"] = stderr[-STDERR_TAIL_LIMIT:]
    return record


# ---- the tail of a worker's stderr ---------------------------------------------------------
#
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


def exit_code_for(failures: Sequence[FailureRecord]) -> int:
    if not failures:
        return 1
    root = sorted(failures, key=failure_sort_key)[0]
    code = int(root.get("exitCode", 1))
    return code if 0 < code < 256 else 1


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``<torchrun flags> -- <user command>`` at the first ``--``."""
    argv = list(argv)
    if "--" not in argv:
        raise ValueError("missing '--' between torchrun flags and the training command")
    i = argv.index("--")
    cmd = argv[i + 1 :]
    if not cmd:
        raise ValueError("no training command after '--'")
    return argv[:i], cmd


def endpoint_host(flags: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Host part of the rendezvous endpoint given by flags or PET_RDZV_ENDPOINT."""
    value: str | None = env.get("PET_RDZV_ENDPOINT") or None
    names = ("--rdzv-endpoint", "--rdzv_endpoint")
    for i, arg in enumerate(flags):
        if arg in names and i + 1 < len(flags):
            value = flags[i + 1]
        elif any(arg.startswith(n + "=") for n in names):
            value = arg.split("=", 1)[1]
    if not value:
        return None
    value = value.strip()
    if value.startswith("["):  # [v6addr]:port
        return value[1 : value.index("]")] if "]" in value else value[1:]
    if value.count(":") > 1:  # bare IPv6 address
        return value
    return value.rsplit(":", 1)[0] if ":" in value else value


# The progress file is written by the user's script: untrusted input. The launcher reads at
# most its last PROGRESS_READ_LIMIT bytes, decodes JSON only when it is shallow (json's decoder
# recurses: a deeply nested array raised RecursionError and broke the launcher), and takes
# only finite numbers in range; any other read is ignored (logged once).
PROGRESS_READ_LIMIT = 4096
MAX_STEP = 2**53  # step and total: integers 0..2**53 (exact as JSON numbers everywhere)
MAX_STEP_TIME = 1e6  # stepTime: seconds, 0..10**6 (sums of them stay finite)
MAX_CHECKPOINT_PATH = 1024  # checkpoint.path: characters (longer: the report is ignored)
_MAX_JSON_NESTING = 16
_DIGITS = re.compile(r"[0-9]{1,32}", re.ASCII)
_progress_warned: set[str] = set()


def _progress_int(value: Any) -> int | None:
    """A step or total: an integer (or integral float, or a string of digits) 0..MAX_STEP."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = int(value) if _DIGITS.fullmatch(value) else None
    elif isinstance(value, float):
        value = int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, int) and 0 <= value <= MAX_STEP:
        return value
    return None


def _progress_seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond float
        return None
    return seconds if 0 <= seconds <= MAX_STEP_TIME else None  # NaN fails both


def _ignore_progress(text: str, why: str) -> None:
    if not _progress_warned:
        _progress_warned.add(why)
        log("ignoring progress file content (logged once)", why=why, content=repr(text[:80]))


def _checkpoint(value: Any) -> dict[str, Any] | None:
    """A checkpoint report {"step": n, "path": "..."}: step 0..MAX_STEP, a path of 1 to
    MAX_CHECKPOINT_PATH characters without NUL or line breaks; anything else is None."""
    if not isinstance(value, dict):
        return None
    step, path = _progress_int(value.get("step")), value.get("path")
    if step is None or not isinstance(path, str) or not 0 < len(path) <= MAX_CHECKPOINT_PATH:
        return None
    if any(c in path for c in "\0\n\r"):
        return None
    return {"step": step, "path": path}


def parse_progress(text: str | None) -> dict[str, Any] | None:
    """What a training script wrote to the progress file (docs/progress.md): its last line
    "<step>" or "<step> <total>", or JSON {"step": n, "total": m, "stepTime": s, "checkpoint":
    {"step": c, "path": p}} (total, stepTime and checkpoint optional: the declared number of
    steps, the seconds this rank spent on its own work in the last step, a checkpoint just
    saved; without "step", a checkpoint's step is the step). None when there is no valid step
    in it; a total, stepTime or checkpoint out of range is dropped. Never raises."""
    text = (text or "").strip()
    if not text:
        return None
    data: Any = None
    if text.startswith("{") and text.count("{") + text.count("[") <= _MAX_JSON_NESTING:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
    if isinstance(data, dict):
        checkpoint = _checkpoint(data.get("checkpoint"))
        if data.get("checkpoint") is not None and checkpoint is None:
            _ignore_progress(text, "checkpoint is not {step: 0..2**53, path: 1..1024 chars}")
        step = _progress_int(data.get("step", checkpoint["step"] if checkpoint else None))
        if step is None:
            _ignore_progress(text, "no step in 0..2**53")
            return None
        out: dict[str, Any] = {"step": step}
        total = _progress_int(data.get("total"))
        if total is not None:
            out["total"] = total
        step_time = _progress_seconds(data.get("stepTime"))
        if step_time is not None:
            out["stepTime"] = step_time
        if checkpoint is not None:
            out["checkpoint"] = checkpoint
        return out
    if text.startswith(("{", "[")):
        _ignore_progress(text, "not a JSON object of at most 16 levels")
        return None
    words = text.splitlines()[-1].split()
    if not words or len(words) > 2 or not all(_DIGITS.fullmatch(w) for w in words):
        _ignore_progress(text, "last line is not '<step>' or '<step> <total>'")
        return None
    step, total = _progress_int(words[0]), _progress_int(words[1]) if len(words) == 2 else None
    if step is None:
        _ignore_progress(text, "no step in 0..2**53")
        return None
    return {"step": step} if total is None else {"step": step, "total": total}


def read_progress_text(path: str | None) -> str | None:
    """The progress file's last PROGRESS_READ_LIMIT bytes (whole lines), or None when there is
    no regular file. Opened without blocking: a FIFO there must not hang the reader."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        start = max(0, st.st_size - PROGRESS_READ_LIMIT)
        data = os.pread(fd, PROGRESS_READ_LIMIT, start)
    except OSError:
        return None
    finally:
        os.close(fd)
    if start > 0:  # began mid-file: drop the partial first line
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    return data.decode("utf-8", errors="replace")


def final_checkpoint(path: str | None) -> dict[str, Any] | None:
    """The latest checkpoint for the final report: the progress file's last line's, else the
    latest the progress thread saw (a checkpoint saved just before the end, on SIGTERM say, is
    in the report even when no read of the status endpoint saw it)."""
    found = parse_progress(read_progress_text(path))
    if found is not None and found.get("checkpoint") is not None:
        return dict(found["checkpoint"])
    return LIVE.checkpoint()


def read_step(path: str | None) -> int | None:
    """Last step a training script wrote to the progress file (see parse_progress)."""
    found = parse_progress(read_progress_text(path))
    return found["step"] if found else None


# ------------------------------------------------------------------------------------------
# state files


def state_dir() -> str:
    return os.environ.get(ENV_STATE_DIR) or STATE_DIR


def _write_atomic(path: str, data: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fp:
        fp.write(data)
    os.replace(tmp, path)


def reset_state_dir(path: str) -> None:
    """Forget a previous container's state: the emptyDir survives container restarts."""
    try:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name in (READY_FILE, STALLED_FILE) or (
                name.startswith(("rank-", "stacks-")) and name.endswith((".json", ".txt"))
            ):
                os.remove(os.path.join(path, name))
    except OSError as e:
        log("cannot prepare state dir", path=path, error=e)


def read_rank_files(path: str) -> list[dict[str, Any]]:
    """Rank files of the last round this node ran (highest restart count)."""
    records: list[dict[str, Any]] = []
    try:
        names = os.listdir(path)
    except OSError:
        return records
    for name in names:
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(path, name)) as fp:
                    records.append(json.load(fp))
            except (OSError, ValueError):
                continue
    if not records:
        return records
    last = max(int(r.get("restartCount", 0)) for r in records)
    return [r for r in records if int(r.get("restartCount", 0)) == last]


_summary_lock = threading.Lock()
_summary_written = threading.Event()


def write_summary(summary: Summary) -> None:
    """The one way a report leaves the launcher, once: later calls (the signal watchdog racing
    the main thread) do nothing. Adds what only the launcher's state knows (the rendezvous
    round, why progress stalled), then writes it to the termination message and stdout."""
    with _summary_lock:
        if _summary_written.is_set():
            return
        _summary_written.set()
    LIVE.update(state=LIVE_FINISHED)
    round_ = LIVE.get("round")
    if summary.get("groupRank") is not None and round_ is not None:
        summary = {**summary, "round": round_}
    notes = [m.note for m in _progress if m.note]
    if notes and summary.get("state") != SUCCEEDED:
        message = "; ".join([*notes, summary.get("message") or ""]).rstrip("; ")
        summary = {**summary, "message": message}
    data = encode_summary(summary)
    path = os.environ.get(ENV_TERMINATION_LOG) or TERMINATION_LOG
    try:
        # open("w") truncates in place: the kubelet bind-mounts this file, so never remove or
        # rename over it.
        with open(path, "wb") as fp:
            fp.write(data)
    except OSError as e:
        log("cannot write termination message", path=path, error=e)
    try:
        sys.stdout.write(data.decode("utf-8") + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


# ------------------------------------------------------------------------------------------
# progress watch (docs/progress.md)


class ProgressWatch:
    """Decides, from what it is shown, when training stopped making progress.

    The clock starts when `ready` appears (rendezvous done, workers started) and restarts
    whenever the progress file's content changes. When it reaches ``timeout`` the watch
    reports "stall"; a later change of the file reports "resume"; a `ready` written anew by
    the workers of another round (torchrun's in-pod restart) re-arms it.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.since: float | None = None  # start of the current quiet period
        self.content: str | None = None
        self.stalled = False

    def observe(self, now: float, ready: bool, content: str | None) -> str:
        changed = content != self.content
        self.content = content
        if self.stalled:
            if changed or ready:
                self.stalled, self.since = False, now
                return "resume" if changed else ""
            return ""
        if not ready:
            self.since = None
            return ""
        if self.since is None or changed:
            self.since = now
            return ""
        if now - self.since >= self.timeout:
            self.stalled = True
            return "stall"
        return ""


def _read_text(path: str) -> str | None:
    try:
        with open(path) as fp:
            return fp.read()
    except OSError:
        return None


class ProgressMonitor:
    """Applies a ProgressWatch to the state dir: on a stall, withdraws readiness (removes
    `ready`, so the readiness probe fails) and writes a `stalled` marker; on progress again,
    puts `ready` back."""

    def __init__(
        self,
        sdir: str,
        progress_file: str,
        timeout: float,
        on_stall: Callable[[], None] | None = None,
    ) -> None:
        self.on_stall = on_stall  # runs before readiness is withdrawn (the stack dumps)
        self.ready_path = os.path.join(sdir, READY_FILE)
        self.stalled_path = os.path.join(sdir, STALLED_FILE)
        self.progress_file = progress_file
        self.watch = ProgressWatch(timeout)
        self._ready_text: str | None = None
        self.note: str | None = None  # for the termination summary while stalled

    def poll(self, now: float, wall: float | None = None) -> str:
        ready_text = _read_text(self.ready_path)
        if ready_text is not None:
            self._ready_text = ready_text
        action = self.watch.observe(
            now, ready_text is not None, read_progress_text(self.progress_file)
        )
        step = read_step(self.progress_file)
        if action == "stall":
            quiet = self.watch.timeout
            self.note = f"no training progress for {quiet:g}s (last step {step})"
            log(
                "progress stalled: withdrawing readiness",
                file=self.progress_file,
                step=step,
                timeout=f"{quiet:g}s",
                ranks=",".join(str(r) for r in _rank_info(os.path.dirname(self.ready_path), [])[1]),
            )
            if self.on_stall is not None:
                # Before the pod turns NotReady: the operator reads the pod when it does.
                try:
                    self.on_stall()
                except Exception as e:  # noqa: BLE001 - the stall must still be reported
                    log("cannot dump stacks", error=f"{type(e).__name__}: {e}")
            marker = {"step": step, "timeout": quiet, "at": round(wall or time.time(), 3)}
            try:
                _write_atomic(self.stalled_path, _dumps(marker) + "\n")
                os.remove(self.ready_path)
            except OSError as e:
                log("cannot withdraw readiness", error=e)
        elif action == "resume":
            self.note = None
            log("progress resumed: readiness restored", step=step)
            try:
                _write_atomic(self.ready_path, self._ready_text or "{}\n")
                os.remove(self.stalled_path)
            except OSError as e:
                log("cannot restore readiness", error=e)
        elif not self.watch.stalled:
            self.note = None
        return action


_progress: list[ProgressMonitor] = []


def progress_timeout() -> float | None:
    raw = os.environ.get(ENV_PROGRESS_TIMEOUT, "")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        log("ignoring invalid progress timeout", value=raw)
        return None
    return value if value > 0 else None


def progress_window() -> float:
    raw = os.environ.get(ENV_PROGRESS_WINDOW, "")
    try:
        value = float(raw) if raw else DEFAULT_PROGRESS_WINDOW
    except ValueError:
        log("ignoring invalid progress window", value=raw)
        return DEFAULT_PROGRESS_WINDOW
    return value if value > 0 else DEFAULT_PROGRESS_WINDOW


def on_stall(sdir: str, monitor: ProgressMonitor) -> None:
    """Training stopped: every Python worker dumps its stacks (to the log, summarised for
    GET /status), so the operator can name the rank that is not inside a collective."""
    stacks = dump_worker_stacks(sdir)
    LIVE.set_stall(
        {"at": round(time.time(), 3), "step": read_step(monitor.progress_file), "stacks": stacks}
    )


def start_progress_monitor(sdir: str) -> ProgressMonitor | None:
    """Reads the progress file every second (less with a short timeout) for GET /status, and
    with TORCHRUN_OPERATOR_PROGRESS_TIMEOUT watches it for stalls (docs/progress.md). Returns
    the stall watch, None without a timeout."""
    timeout, path = progress_timeout(), os.environ.get(ENV_PROGRESS_FILE)
    if not path:
        return None
    monitor = None
    if timeout is not None:
        watch = monitor = ProgressMonitor(sdir, path, timeout)
        monitor.on_stall = lambda: on_stall(sdir, watch)
    window = progress_window()
    interval = min(1.0, timeout / 4) if timeout is not None else 1.0
    if monitor is not None:
        _progress.append(monitor)
        log("watching training progress", file=path, timeout=f"{timeout:g}s")

    resume = os.path.join(sdir, RESUME_FILE)
    written: list[str | None] = [None]

    def run() -> None:
        while True:
            try:
                LIVE.observe_progress(time.time(), read_progress_text(path), window)
                checkpoint = LIVE.checkpoint()
                if checkpoint is not None and checkpoint["path"] != written[0]:
                    # Workers of an in-pod restart resume from it (worker_code).
                    _write_atomic(resume, checkpoint["path"])
                    written[0] = checkpoint["path"]
                if monitor is not None and monitor.poll(time.monotonic()) == "resume":
                    LIVE.set_stall(None)
            except Exception as e:  # noqa: BLE001 - the watch must never kill the launcher
                log("progress watch error", error=f"{type(e).__name__}: {e}")
            time.sleep(interval)

    threading.Thread(target=run, daemon=True, name="progress-watch").start()
    return monitor


# ------------------------------------------------------------------------------------------
# live status: what the operator reads at GET /status (docs/pod-contract.md)


class ProgressMeter:
    """Steps per second and time per step over a sliding window, from what the progress file
    said each time it was read. Pure: it is shown (wall time, file content) and keeps the
    moments the step changed."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.samples: deque[tuple[float, int, float | None]] = deque()  # (t, step, stepTime)
        self.step: int | None = None
        self.total: int | None = None
        self.last_step_at: float | None = None
        self.first_at: float | None = None  # when a step was first seen
        self.checkpoint: dict[str, Any] | None = None  # the latest reported, with "at"

    def observe(self, now: float, text: str | None) -> None:
        found = parse_progress(text)
        if found is None:
            return
        step = int(found["step"])
        checkpoint = found.get("checkpoint")
        if checkpoint is not None and (
            self.checkpoint is None
            or (checkpoint["step"], checkpoint["path"])
            != (self.checkpoint["step"], self.checkpoint["path"])
        ):
            self.checkpoint = {**checkpoint, "at": round(now, 3)}
        if found.get("total") is not None:
            self.total = int(found["total"])
        if step != self.step:
            if self.step is not None and step < self.step:
                self.samples.clear()  # restored from an earlier checkpoint: start anew
                self.first_at = None
            self.step = step
            self.last_step_at = now
            self.samples.append((now, step, found.get("stepTime")))
            if self.first_at is None:
                self.first_at = now
        # Keep the window's samples and the one just before it (where the window starts).
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()

    def snapshot(self, now: float) -> dict[str, Any] | None:
        if self.step is None:
            return None
        out: dict[str, Any] = {"step": self.step, "windowSeconds": self.window}
        if self.total is not None:
            out["total"] = self.total
        if self.checkpoint is not None:
            out["checkpoint"] = dict(self.checkpoint)
        if self.last_step_at is not None:
            out["lastStepAt"] = round(self.last_step_at, 3)
        if len(self.samples) >= 2:
            t0, s0, _ = self.samples[0]
            t1, s1, _ = self.samples[-1]
            if now > t0 and s1 > s0:
                # To now, not to the last change: a pod that stopped slows down here.
                out["stepsPerSecond"] = round((s1 - s0) / (now - t0), 4)
                out["stepSeconds"] = round((t1 - t0) / (s1 - s0), 4)
            reported = [t for _, _, t in list(self.samples)[1:] if t is not None]
            if reported:
                out["stepSeconds"] = round(sum(reported) / len(reported), 4)
        in_window = sum(1 for t, _, _ in self.samples if t > now - self.window)
        out["windowFull"] = bool(
            self.first_at is not None and now - self.first_at >= self.window and in_window >= 3
        )
        return out


class LiveState:
    """What this launcher knows now, for GET /status. Written by the agent's thread (the
    rendezvous), the progress thread and the stall handling; read by the server's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fields: dict[str, Any] = {"v": LIVE_VERSION, "state": LIVE_STARTING}
        self.meter: ProgressMeter | None = None
        self.stall: dict[str, Any] | None = None

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.fields.update(fields)

    def get(self, key: str) -> Any:
        with self._lock:
            return self.fields.get(key)

    def observe_progress(self, now: float, text: str | None, window: float) -> None:
        with self._lock:
            if self.meter is None:
                self.meter = ProgressMeter(window)
            self.meter.observe(now, text)

    def checkpoint(self) -> dict[str, Any] | None:
        """The latest checkpoint the script reported, {step, path, at}."""
        with self._lock:
            found = self.meter.checkpoint if self.meter else None
            return dict(found) if found else None

    def set_stall(self, stall: dict[str, Any] | None) -> None:
        with self._lock:
            self.stall = stall
            if self.fields.get("state") in (LIVE_TRAINING, LIVE_STALLED):
                self.fields["state"] = LIVE_STALLED if stall else LIVE_TRAINING

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        with self._lock:
            out = dict(self.fields)
            progress = self.meter.snapshot(now) if self.meter else None
            if progress:
                out["progress"] = progress
            if self.stall:
                out["stall"] = self.stall
        out["time"] = round(now, 3)
        return out


LIVE = LiveState()


def flag_value(flags: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last of `names` in torchrun flags (``--x v`` or ``--x=v``)."""
    value = None
    for i, arg in enumerate(flags):
        if arg in names and i + 1 < len(flags):
            value = flags[i + 1]
        elif any(arg.startswith(n + "=") for n in names):
            value = arg.split("=", 1)[1]
    return value


class _StatusHandler(http.server.BaseHTTPRequestHandler):
    server_version = "torchrun-operator-launcher"
    timeout = 5  # a slow or silent client does not keep a thread

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] != STATUS_PATH:
            self.send_error(404)
            return
        body = _dumps(LIVE.snapshot()).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per read every few seconds would drown the training log


class _StatusServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 16


def _ipv6_server(port: int) -> _StatusServer:
    class Dual(_StatusServer):
        address_family = socket.AF_INET6

        def server_bind(self) -> None:
            # Both families on one socket: pods may have an IPv4 or an IPv6 address.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            super().server_bind()

    return Dual(("::", port), _StatusHandler)


def start_status_server(port: int | None = None) -> _StatusServer | None:
    """Serve LIVE read-only on every address of the pod, in daemon threads. A port that is
    taken (a hostNetwork pod next to another) is logged and skipped: the operator then only
    learns what the pod's status says."""
    if port is None:
        raw = os.environ.get(ENV_STATUS_PORT, "")
        try:
            port = int(raw) if raw else STATUS_PORT
        except ValueError:
            log("ignoring invalid status port", value=raw)
            port = STATUS_PORT
    if port <= 0:
        return None
    server: _StatusServer | None = None
    errors = []
    for make in (_ipv6_server, lambda p: _StatusServer(("0.0.0.0", p), _StatusHandler)):
        try:
            server = make(port)
            break
        except OSError as e:
            errors.append(str(e))
    if server is None:
        log("cannot serve status", port=port, error="; ".join(errors))
        return None
    threading.Thread(target=server.serve_forever, daemon=True, name="status-server").start()
    return server


def _patch_rendezvous_reporting() -> None:
    """Wrap torch's agent rendezvous so LIVE learns this node's rank, its workers' global
    ranks and the rendezvous round the moment the agent completes a round."""
    try:
        from torch.distributed.elastic.agent.server import api as agent_api
    except ImportError:
        return
    cls = agent_api.SimpleElasticAgent
    original = cls._rendezvous
    if getattr(original, "_torchrun_operator", False):
        return

    def _rendezvous(self: Any, worker_group: Any) -> None:
        LIVE.update(state=LIVE_RENDEZVOUS)
        original(self, worker_group)
        try:
            spec = worker_group.spec
            handler = getattr(spec, "rdzv_handler", None)
            holder = getattr(handler, "_state_holder", None)
            rdzv_round = getattr(getattr(holder, "state", None), "round", None)
            remaining = getattr(self, "_remaining_restarts", None)
            restarts = spec.max_restarts - remaining if isinstance(remaining, int) else None
            ranks = sorted(int(w.global_rank) for w in worker_group.workers)
            LIVE.update(
                state=LIVE_TRAINING,
                groupRank=int(worker_group.group_rank),
                groupWorldSize=int(worker_group.group_world_size),
                ranks=ranks,
                round=rdzv_round if isinstance(rdzv_round, int) else None,
                restarts=restarts,
                rendezvousAt=round(time.time(), 3),
            )
            LIVE.set_stall(None)
            log(
                "rendezvous complete",
                round=rdzv_round,
                node_rank=worker_group.group_rank,
                ranks=",".join(map(str, ranks)),
            )
        except Exception as e:  # noqa: BLE001 - reporting must never break training
            log("cannot report rendezvous", error=f"{type(e).__name__}: {e}")

    _rendezvous._torchrun_operator = True  # type: ignore[attr-defined]
    cls._rendezvous = _rendezvous  # type: ignore[method-assign]


# ---- stacks of a stalled pod --------------------------------------------------------------

_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_THREAD = re.compile(r"^(?:Current thread|Thread) (?P<ident>0x[0-9a-fA-F]+)")


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(d.rstrip("/") + "/" for d in dirs if d))


def analyze_stacks(
    text: str, main_thread: int | None, library_dirs: Sequence[str] | None = None
) -> dict[str, Any]:
    """From a faulthandler dump: whether the main thread is inside a collective (a frame of
    torch.distributed or torch.nn.parallel), and where it is: its innermost frame outside the
    Python library, site-packages and this launcher, else its innermost frame."""
    blocks: dict[int | None, list[tuple[str, int, str]]] = {}
    current: list[tuple[str, int, str]] | None = None
    first: int | None = None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            ident = int(m.group("ident"), 16)
            current = blocks.setdefault(ident, [])
            if first is None or line.startswith("Current thread"):
                first = ident
            continue
        f = _FRAME.match(line)
        if f and current is not None:
            current.append((f.group("file"), int(f.group("line")), f.group("func")))
    frames = blocks.get(main_thread) if main_thread is not None else None
    if frames is None:
        frames = blocks.get(first, [])
    if not frames:
        return {"inCollective": False, "at": None}
    libs = tuple(library_dirs if library_dirs is not None else _library_dirs())
    in_collective = any(any(p in f for p in _COLLECTIVE_PATHS) for f, _, _ in frames)
    here = os.path.abspath(__file__)

    def own(path: str) -> bool:
        return not (path.startswith(libs) or path.startswith("<") or os.path.abspath(path) == here)

    path, lineno, func = next((fr for fr in frames if own(fr[0])), frames[0])
    return {"inCollective": in_collective, "at": f"{path}:{lineno} in {func}"}


def dump_worker_stacks(sdir: str, wait: float = STACK_DUMP_WAIT) -> list[dict[str, Any]]:
    """Have every worker of this node that registered a stack dump (the Python ones) write
    its stacks, copy them to the log, and summarise each."""
    targets = []
    for r in read_rank_files(sdir):
        path, pid = r.get("stacks"), r.get("pid")
        if not isinstance(path, str) or not isinstance(pid, int):
            continue
        try:
            offset = os.path.getsize(path)
            os.kill(pid, signal.SIGUSR1)
        except OSError as e:
            log("cannot dump stacks", rank=r.get("rank"), error=e)
            continue
        targets.append((r, path, offset))
    deadline = time.monotonic() + wait
    sizes: dict[str, int] = {}
    while targets and time.monotonic() < deadline:
        time.sleep(0.1)
        now = {path: _file_size(path) for _, path, _ in targets}
        grown = all(now[path] > offset for _, path, offset in targets)
        if grown and now == sizes:
            break  # every dump written, and none still growing
        sizes = now
    out = []
    for r, path, offset in targets:
        try:
            with open(path, errors="replace") as fp:
                fp.seek(offset)
                text = fp.read()
        except OSError:
            text = ""
        thread = r.get("thread")
        summary = analyze_stacks(text, thread if isinstance(thread, int) else None)
        log(
            "stacks of a stalled rank",
            rank=r.get("rank"),
            local_rank=r.get("localRank"),
            in_collective=summary["inCollective"],
            at=summary["at"],
        )
        try:
            sys.stderr.write(text if text.endswith("\n") or not text else text + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        out.append({"rank": r.get("rank"), "localRank": r.get("localRank"), **summary})
    return sorted(out, key=lambda s: s["rank"] if isinstance(s["rank"], int) else -1)


# ---- stacks on a communication failure -----------------------------------------------------
#
# When a collective times out or a peer drops out, the rank that failed first is a victim: the
# cause is the rank that never arrived, still alive somewhere outside the collective. On the
# first communication failure the agent sees (a worker's error or stderr tail, or its own
# rendezvous store gone), before torchrun stops the workers, every live worker of this node
# dumps its stacks; the ranks found outside a collective go into the report (`stacks`).

MAX_REPORT_STACKS = 4  # ranks outside a collective named in the report
_comm_stacks: list[dict[str, Any]] = []  # what the dump found (once per launcher)
_comm_dumped: list[bool] = []


def report_stacks(stacks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The report's `stacks`: the ranks outside any collective, at most MAX_REPORT_STACKS."""
    out = []
    for s in stacks:
        rank, at = s.get("rank"), s.get("at")
        if s.get("inCollective") or not isinstance(rank, int) or isinstance(rank, bool):
            continue
        entry: dict[str, Any] = {"rank": rank, "inCollective": False}
        if isinstance(at, str) and at:
            entry["at"] = truncate_text(at, 256)
        out.append(entry)
    return out[:MAX_REPORT_STACKS]


def on_comm_failure(sdir: str, why: str) -> None:
    """The first communication failure: dump the live workers' stacks (once)."""
    if _comm_dumped:
        return
    _comm_dumped.append(True)
    log("communication failure: dumping the workers' stacks", why=truncate_text(why, 300))
    _comm_stacks[:] = report_stacks(dump_worker_stacks(sdir))


def _failure_text(pf: Any, log_dir: str | None) -> str:
    """What a failed worker said: its recorded error, else the tail of its stderr."""
    text = error_text_from_record(getattr(pf, "error_file_data", None))
    if text:
        return text
    local_rank = getattr(pf, "local_rank", None)
    if not isinstance(local_rank, int):
        return ""
    return read_stderr_tail(stderr_log_path(log_dir, local_rank) if log_dir else None) or ""


_handlers: list[Any] = []  # the agent's rendezvous handler, once its run loop started


def _failed_key(handler: Any) -> str | None:
    """The store key an agent whose workers failed sets for the current rendezvous round,
    before torch closes the rendezvous: the other agents tell that closure from the one after
    every agent passed the exit barrier (success)."""
    run_id = getattr(getattr(handler, "_settings", None), "run_id", None)
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    round_ = getattr(state, "round", None)
    if run_id is None or not isinstance(round_, int):
        return None
    return f"torchrun-operator/{run_id}/{round_}/workers-failed"


RENDEZVOUS_CLOSED = (
    "the rendezvous was closed while this node's workers ran: another node's agent ended "
    "(its workers failed)"
)


def _patch_comm_failure_stacks(sdir: str, log_dir: str | None) -> None:
    """Wrap torchrun's process context, run loop and rendezvous handler: when a worker failed
    with an error that says communication, the run loop ended on a lost store, or another
    node's agent closed the rendezvous while this node's workers run, the workers still
    running dump their stacks before torchrun stops them (its process context stops them the
    moment it sees a failure, before the agent hears of it)."""
    try:
        from torch.distributed.elastic.agent.server import api as agent_api
        from torch.distributed.elastic.multiprocessing import api as mp_api
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
        from torch.distributed.elastic.rendezvous.api import RendezvousClosedError
    except ImportError:
        return
    close = mp_api.PContext.close
    invoke = agent_api.SimpleElasticAgent._invoke_run
    waiting = rdzv.DynamicRendezvousHandler.num_nodes_waiting
    if getattr(close, "_torchrun_operator", False):
        return

    def _close(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            failures = getattr(self, "_failures", None)
            key = _failed_key(_handlers[0]) if failures and _handlers else None
            if key is not None:
                _handlers[0]._store.set(key, "1")  # before torch closes the rendezvous
            for pf in failures.values() if isinstance(failures, dict) else []:
                text = _failure_text(pf, log_dir)
                if is_comm_error(text):
                    on_comm_failure(sdir, text.strip().splitlines()[-1])
                    break
        except Exception as e:  # noqa: BLE001 - the dump must never change the run
            log("cannot dump stacks", error=f"{type(e).__name__}: {e}")
        close(self, *args, **kwargs)

    def _invoke_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            spec = getattr(getattr(self, "_worker_group", None), "spec", None)
            handler = getattr(spec, "rdzv_handler", None)
            if handler is not None:
                _handlers[:] = [handler]
            return invoke(self, *args, **kwargs)
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            if is_comm_error(text):
                try:
                    on_comm_failure(sdir, text)
                except Exception as dump_error:  # noqa: BLE001 - the error must propagate
                    log("cannot dump stacks", error=f"{dump_error}")
            raise

    def num_nodes_waiting(self: Any) -> int:
        # The agent asks this while its workers are healthy, having synced the rendezvous
        # state. A closed rendezvous whose round another agent marked failed (above) means
        # that agent gave up for good: this node's workers wait for a peer that is gone. The
        # one that is not inside a collective is the one the others waited for: dump, and
        # end like a lost store. (torch also closes the rendezvous after success, once every
        # agent passed the exit barrier or a late one's barrier timed out: no mark then.)
        count = waiting(self)
        state = getattr(getattr(self, "_state_holder", None), "state", None)
        if getattr(state, "closed", False) is True:
            key = _failed_key(self)
            try:
                failed = key is not None and bool(self._store.check([key]))
            except Exception:  # noqa: BLE001 - no store, no verdict: carry on as torch does
                failed = False
            if failed:
                on_comm_failure(sdir, RENDEZVOUS_CLOSED)
                raise RendezvousClosedError(RENDEZVOUS_CLOSED)
        return int(count)

    _close._torchrun_operator = True  # type: ignore[attr-defined]
    mp_api.PContext.close = _close  # type: ignore[method-assign]
    agent_api.SimpleElasticAgent._invoke_run = _invoke_run  # type: ignore[method-assign]
    rdzv.DynamicRendezvousHandler.num_nodes_waiting = num_nodes_waiting  # type: ignore[method-assign]


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def dump_own_stacks(why: str) -> None:
    """The launcher's own threads, to the log (a rendezvous that never completed)."""
    log("launcher stacks follow", reason=why)
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def _register_stack_dump(sdir: str, local_rank: str) -> str | None:
    """In a Python worker: SIGUSR1 dumps every thread's stack to stacks-<local rank>.txt."""
    path = os.path.join(sdir, f"stacks-{local_rank}.txt")
    try:
        fp = open(path, "w")  # noqa: SIM115 - kept open for faulthandler for the process's life
        faulthandler.register(signal.SIGUSR1, file=fp, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError, AttributeError) as e:
        log("worker: no stack dumps", error=e)
        return None
    _stack_files.append(fp)
    return path


_stack_files: list[Any] = []


# ------------------------------------------------------------------------------------------
# DNS wait


def wait_for_dns(
    host: str,
    timeout: float,
    resolve: Callable[[str], Any] | None = None,
    interval: float = 0.5,
    log_every: float = DNS_LOG_INTERVAL,
) -> bool:
    """Wait until ``host`` resolves or ``timeout`` seconds pass. Returns whether it resolved.

    Each lookup runs in a daemon thread so a resolver that hangs cannot stretch the bound.
    """

    def _default(h: str) -> Any:
        return socket.getaddrinfo(h, None)

    lookup = resolve or _default
    start = time.monotonic()
    deadline = start + timeout
    last_log = start
    last_error = ""
    while True:
        result: dict[str, Any] = {}

        def attempt(res: dict[str, Any] = result) -> None:
            try:
                res["addrs"] = lookup(host)
            except Exception as e:  # noqa: BLE001 - any failure means "not yet"
                res["error"] = f"{type(e).__name__}: {e}"

        t = threading.Thread(target=attempt, daemon=True, name="dns-wait")
        t.start()
        t.join(max(0.0, deadline - time.monotonic()))
        now = time.monotonic()
        if "addrs" in result:
            addrs = sorted({a[4][0] for a in result["addrs"] if len(a) > 4 and a[4]})
            log(
                "rendezvous host resolved",
                host=host,
                addresses=",".join(addrs) or "?",
                waited=f"{now - start:.1f}s",
            )
            return True
        last_error = result.get("error", "lookup still running")
        if now >= deadline:
            return False
        if now - last_log >= log_every:
            log(
                "waiting for rendezvous host to resolve",
                host=host,
                waited=f"{now - start:.0f}s",
                timeout=f"{timeout:g}s",
                last_error=last_error,
            )
            last_log = now
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


# ------------------------------------------------------------------------------------------
# worker shim: runs inside every torchrun worker process


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
    as a string, which torchelastic parses); ``timestampPrecise`` is our addition."""
    return {
        "message": {
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {
                "py_callstack": tb,
                "timestamp": str(int(now)),
                "timestampPrecise": f"{now:.3f}",
            },
        }
    }


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
        _write_atomic(os.path.join(sdir, f"rank-{local_rank}.json"), _dumps(record))
        # The shim only runs once rendezvous completed: this worker exists => training started.
        _write_atomic(os.path.join(sdir, READY_FILE), _dumps(record) + "\n")
    except OSError as e:
        log("cannot write worker state", dir=sdir, error=e)


# How torchrun's agent starts each worker: ``python -u -c WORKER_BOOTSTRAP <launcher.py>
# --worker <command...>``. The bootstrap loads this file as a module and runs the user's script
# from its own top level, so the script's frames sit on one frame with no source file, as under
# ``python script.py`` they sit on none. Frames beneath the script are not free: code that
# formats its own stack pays for each (torch.manual_seed does, in torch.cuda's lazy-call queue,
# once per FakeData sample), and the launcher's and runpy's seven made a loader-bound tutorial
# script 1.2-1.5x slower in the pods (bench/README.md).
WORKER_BOOTSTRAP = (
    "import importlib.util as u,sys\n"
    "s=u.spec_from_file_location('torchrun_operator_worker_shim',sys.argv[1])\n"
    "m=u.module_from_spec(s);sys.modules[s.name]=m;s.loader.exec_module(m)\n"
    "try:c,g=m.worker_code(sys.argv[3:]);exec(c,g)\n"
    "except Exception as e:sys.exit(m.worker_failed(e))\n"
)


def worker_entry_args(cmd: list[str]) -> list[str]:
    """The interpreter's arguments for one worker (torchrun's agent starts sys.executable)."""
    return ["-u", "-c", WORKER_BOOTSTRAP, os.path.abspath(__file__), "--worker", *cmd]


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
        stacks = _register_stack_dump(sdir, os.environ.get("LOCAL_RANK", "0"))
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
    """``launcher.py --worker <command...>`` run directly (not how the agent starts workers:
    see WORKER_BOOTSTRAP): the same shim, beneath this file's frames."""
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


# ------------------------------------------------------------------------------------------
# agent side


class _Terminated(Exception):
    """SIGTERM/SIGINT before torch's agent took over signal handling."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"launcher got signal {signal.Signals(signum).name}")
        self.signum = signum


_python_handler_ran = threading.Event()


def _early_signal_handler(signum: int, frame: Any) -> None:
    _python_handler_ran.set()
    raise _Terminated(signum)


def _kill_children() -> None:
    """SIGKILL the process groups of our children (torchrun workers run in their own)."""
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fp:
                stat = fp.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid != me:
            continue
        try:
            pgid = os.getpgid(pid)
            if pgid != os.getpgid(0):
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _start_signal_watchdog(grace: float) -> None:
    """Exit promptly on SIGTERM even when the main thread is stuck in C++ (a TCPStore call
    during rendezvous does not return to the interpreter, so no Python handler runs).

    The C-level handler writes the signal number to a wakeup fd even then; this thread reads
    it. If the Python handler ran, torch's agent is shutting its workers down: give it
    ``grace`` seconds. Otherwise force the exit after a short pause.
    """
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            try:
                data = os.read(r, 16)
            except OSError:
                return
            sigs = [b for b in data if b in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)]
            if not sigs:
                continue
            sig = signal.Signals(sigs[0]).name
            stuck = not _python_handler_ran.wait(3.0)
            if not stuck:
                time.sleep(grace)
            log(
                "forcing exit after signal",
                signal=sig,
                reason="main thread unresponsive" if stuck else f"shutdown exceeded {grace:g}s",
            )
            _kill_children()
            write_summary(build_summary(FAILED, message=f"launcher terminated by {sig}"))
            os._exit(1)

    threading.Thread(target=watch, daemon=True, name="signal-watchdog").start()


def _patch_torch_signal_handler() -> None:
    """torch's agent installs its own handler when workers start; wrap it so the watchdog knows
    the Python-level shutdown is under way."""
    try:
        from torch.distributed.elastic.multiprocessing import api as mp_api
    except ImportError:
        return
    original = getattr(mp_api, "_terminate_process_handler", None)
    if original is None or getattr(original, "_torchrun_operator", False):
        return

    def handler(signum: int, frame: Any) -> None:
        _python_handler_ran.set()
        original(signum, frame)

    handler._torchrun_operator = True  # type: ignore[attr-defined]
    mp_api._terminate_process_handler = handler
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)


def _dns_timeout() -> float:
    raw = os.environ.get(ENV_DNS_TIMEOUT, "")
    try:
        return float(raw) if raw else DEFAULT_DNS_TIMEOUT
    except ValueError:
        log("ignoring invalid DNS timeout", value=raw)
        return DEFAULT_DNS_TIMEOUT


def _shutdown_timeout(flags: list[str]) -> float:
    for i, arg in enumerate(flags):
        if arg in ("--shutdown-timeout", "--shutdown_timeout") and i + 1 < len(flags):
            try:
                return float(flags[i + 1])
            except ValueError:
                pass
    for name in ("PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        try:
            return float(os.environ[name])
        except (KeyError, ValueError):
            continue
    return 30.0


def _rank_info(sdir: str, fallback_ranks: Sequence[int]) -> tuple[int | None, list[int], int]:
    records = read_rank_files(sdir)
    group_ranks = {int(r.get("groupRank", -1)) for r in records} - {-1}
    group_rank = group_ranks.pop() if len(group_ranks) == 1 else None
    ranks = sorted({int(r["rank"]) for r in records if int(r.get("rank", -1)) >= 0})
    if not ranks:
        ranks = sorted(int(r) for r in fallback_ranks)
    restarts = max((int(r.get("restartCount", 0)) for r in records), default=0)
    return group_rank, ranks, restarts


def run_agent(flags: list[str], cmd: list[str]) -> int:
    """Everything after the DNS wait: build torchrun's config, run the agent, summarise."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousError,
        RendezvousTimeoutError,
    )
    from torch.distributed.launcher.api import launch_agent
    from torch.distributed.run import config_from_args, get_args_parser

    _patch_torch_signal_handler()
    _patch_rendezvous_reporting()

    sdir = state_dir()
    step_file = os.environ.get(ENV_PROGRESS_FILE)
    start_progress_monitor(sdir)
    parser = get_args_parser()
    own_log_dir = os.path.join(sdir, LOGS_DIR)
    flags, log_dir = stderr_capture_flags(flags, os.environ, own_log_dir)
    _patch_comm_failure_stacks(sdir, log_dir)
    if log_dir == own_log_dir:  # the emptyDir outlives the container: drop the last one's logs
        shutil.rmtree(own_log_dir, ignore_errors=True)
    # The placeholder script is replaced below: only the launch configuration is taken from
    # torchrun's parser, so the user's command never meets argparse.
    try:
        args = parser.parse_args([*flags, "--no-python", "__torchrun_operator_worker__"])
    except SystemExit as e:  # argparse already printed why
        raise ValueError(f"invalid torchrun flags (argparse exit {e.code}): {flags}") from None
    if args.standalone:
        raise ValueError("--standalone is not supported: the operator runs c10d rendezvous")
    if args.master_port is None:
        args.master_port = 29500
    config, _, _ = config_from_args(args)
    entrypoint = sys.executable
    entry_args = worker_entry_args(cmd)
    log(
        "starting torchrun agent",
        nnodes=args.nnodes,
        nproc_per_node=config.nproc_per_node,
        rdzv_endpoint=config.rdzv_endpoint,
        rdzv_id=config.run_id,
        max_restarts=config.max_restarts,
        command=" ".join(cmd),
    )

    # Every way the agent ends comes down to the same report: a state, the failures or a
    # message, the ranks this node ran (from the workers' rank files, else those torch names)
    # and the exit code; one place writes it.
    failures: list[FailureRecord] = []
    message: str | None = None
    known_ranks: list[int] = []
    try:
        results = launch_agent(config, entrypoint, entry_args)
        state, code, known_ranks = SUCCEEDED, 0, list(results or {})
    except ChildFailedError as e:
        failures = [
            failure_record(
                rank=grank,
                local_rank=pf.local_rank,
                exitcode=pf.exitcode,
                error_file_data=pf.error_file_data,
                fallback_message=pf.message if isinstance(pf.message, str) else "",
                timestamp=pf.timestamp,
                stderr=None
                if error_text_from_record(pf.error_file_data)
                else read_stderr_tail(stderr_log_path(log_dir, pf.local_rank)),
            )
            for grank, pf in e.failures.items()
        ]
        state, code, known_ranks = FAILED, exit_code_for(failures), list(e.failures)
        for f in sorted(failures, key=failure_sort_key):
            last_line = f["error"].strip().splitlines()[-1] if f["error"].strip() else ""
            log(
                "worker failed",
                rank=f["rank"],
                local_rank=f["localRank"],
                exit_code=f["exitCode"],
                kind=f["kind"],
                error=truncate_text(last_line, 300),
            )
    except RendezvousTimeoutError as e:
        state, code = RENDEZVOUS_TIMEOUT, 1
        message = (
            f"rendezvous did not complete in time (join_timeout) at "
            f"{config.rdzv_endpoint}: not all nodes joined" + (f": {e}" if str(e) else "")
        )
        log("rendezvous timed out", endpoint=config.rdzv_endpoint)
        dump_own_stacks("rendezvous timed out")
    except (RendezvousError, SignalException, _Terminated) as e:
        state, code = FAILED, 1
        message = f"{type(e).__name__}: {e}"
        if isinstance(e, SignalException):
            message = f"launcher terminated by {e.sigval.name}; workers stopped ({message})"
        log("agent stopped", error=message)

    group_rank, ranks, restarts = _rank_info(sdir, known_ranks)
    if state == SUCCEEDED:
        log(
            "training succeeded",
            group_rank=group_rank,
            ranks=",".join(map(str, ranks)),
            restarts=restarts,
        )
    write_summary(
        build_summary(
            state,
            group_rank=group_rank,
            ranks=ranks,
            restarts=restarts,
            failures=failures,
            message=message,
            step=read_step(step_file),
            checkpoint=final_checkpoint(step_file),
            stacks=_comm_stacks,
        )
    )
    return code


def launcher_main(argv: list[str]) -> int:
    try:
        flags, cmd = split_argv(argv)
    except ValueError as e:
        sys.stderr.write(USAGE)
        log("bad arguments", error=e)
        write_summary(build_summary(ERROR, message=f"launcher: {e}"))
        return 2

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _early_signal_handler)
    _start_signal_watchdog(_shutdown_timeout(flags) + 5.0)

    index = os.environ.get(ENV_INDEX) or os.environ.get(ENV_NODE_RANK)
    log("launcher starting", pid=os.getpid(), index=index or "?", state_dir=state_dir())
    reset_state_dir(state_dir())
    LIVE.update(
        index=int(index) if index and index.isdigit() else None,
        rdzvId=flag_value(flags, ("--rdzv-id", "--rdzv_id")) or os.environ.get("PET_RDZV_ID"),
    )
    start_status_server()
    progress_file = os.environ.get(ENV_PROGRESS_FILE)
    if progress_file and os.path.exists(progress_file):
        try:  # a previous container's step is not this one's progress
            os.remove(progress_file)
        except OSError as e:
            log("cannot remove old progress file", path=progress_file, error=e)
    try:
        host = endpoint_host(flags, os.environ)
        if host:
            timeout = _dns_timeout()
            if not wait_for_dns(host, timeout):
                message = (
                    f"rendezvous host {host!r} did not resolve within {timeout:g}s "
                    f"({ENV_DNS_TIMEOUT}); is the headless Service there and does it "
                    f"publish not-ready addresses?"
                )
                log("DNS wait timed out", host=host, timeout=f"{timeout:g}s")
                write_summary(build_summary(DNS_TIMEOUT, message=message))
                return 1
        return run_agent(flags, cmd)
    except _Terminated as e:
        log("terminated before training started", signal=signal.Signals(e.signum).name)
        write_summary(build_summary(FAILED, message=str(e)))
        return 1
    except Exception as e:  # noqa: BLE001 - a launcher bug must still leave a summary
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        log("launcher error", error=f"{type(e).__name__}: {e}")
        message = f"launcher error: {type(e).__name__}: {e}\n{tb}"
        write_summary(build_summary(ERROR, message=message))
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--worker":
        return worker_main(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    return launcher_main(argv)


if __name__ == "__main__":
    sys.exit(main())
