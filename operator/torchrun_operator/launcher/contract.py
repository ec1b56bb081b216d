"""The pod contract (docs/pod-contract.md): the one module the operator reads it from.

Everything the renderer puts into a training pod for the launcher, and everything the launcher
hands back to the operator, is named here and nowhere else: render/, reconcile/ and
kube/rankmap.py import these names (`from ..launcher import contract`). Like every module of
the launcher it imports only the standard library.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Final, Literal, TypedDict

# Where the launcher's ConfigMap is mounted, and the launcher's file name in it.
LAUNCHER_DIR = "/opt/torchrun-operator"
LAUNCHER_FILE = "launcher.pyz"  # a zipapp of this package (render/configmap.py)
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
# The gang attempt the pod belongs to (status.attempt when it was created; an elastic
# replacement has its attempt's): a script names what it writes to shared storage with it, so
# an earlier attempt's pods still running on a partitioned node never write the same files.
ENV_ATTEMPT = "TORCHRUN_OPERATOR_ATTEMPT"
ENV_LOCAL_RANK_ARG = "TORCHRUN_OPERATOR_LOCAL_RANK_ARG"
ENV_STATUS_PORT = "TORCHRUN_OPERATOR_STATUS_PORT"
ENV_PROGRESS_WINDOW = "TORCHRUN_OPERATOR_PROGRESS_WINDOW"
# spec.checkpoint (docs/progress.md, "Checkpoints"): the mounted storage, and the latest
# checkpoint a script reported (the operator renders it from status.lastCheckpoint; the
# launcher passes a newer one it saw itself to the workers of an in-pod restart).
ENV_CHECKPOINT_DIR = "TORCHRUN_OPERATOR_CHECKPOINT_DIR"
ENV_RESUME_FROM = "TORCHRUN_OPERATOR_RESUME_FROM"


def checkpoint_outside(path: str, directory: str) -> str | None:
    """Why a reported checkpoint `path` does not lie in the checkpoint storage mounted at
    `directory` (spec.checkpoint.mountPath, $TORCHRUN_OPERATOR_CHECKPOINT_DIR), or None when it
    does: an absolute path without a `..` component, at or under the directory. Only such a
    path is resumed from: any other would make every later pod of the job read whatever a
    script (or anything else that writes the pod's reports) named."""
    if not path.startswith("/"):
        return "is not an absolute path"
    if ".." in path.split("/"):
        return "holds a '..' component"
    root = posixpath.normpath(directory)
    found = posixpath.normpath(path)
    if found != root and not found.startswith(root.rstrip("/") + "/"):
        return f"is not under the checkpoint mount {root}"
    return None


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
    # Only when the worker recorded an error: where the user's code raised it, `file:line in
    # function` (launcher/frames.py), at most LOCATION_LIMIT characters.
    location: str


STDERR_TAIL_LIMIT = 2048
# A stack frame as the report and the status answer name it, "file:line in function": a long
# path still leaves room for its file's name, line and function; the operator truncates to the
# same (reconcile/podinput.MAX_LOCATION).
LOCATION_LIMIT = 256


# After a communication failure, the report names at most this many ranks outside a collective.
MAX_REPORT_STACKS = 4


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
    # When the report was written, on the launcher's clock (as its failures' `at`): with
    # failures only. What the operator takes from it is how long before the report each
    # failure was, which no difference between the node's clock and its own can change.
    reportedAt: float


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
