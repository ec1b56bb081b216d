"""What GPUs, CUDA, NCCL and gloo say when a rank fails: the one table of failure kinds.

Each entry names a kind (`status.failure.kind`), its class (user: the job fails, restarting
would fail the same way; infrastructure: a restart may help), whether the node the rank ran on
is to blame (its next attempt keeps off that node: reconcile/failure/avoid.py) and what the
operator does, and the patterns that recognise it in a worker's recorded error or the tail of
its stderr. docs/failures.md is this table for people; tests/unit/reconcile/test_failurekinds.py
holds it against messages captured from torch, NCCL and gloo (tests/fixtures/failures/).

The first entry whose pattern matches wins, so the order matters: a CUDA out-of-memory inside
an NCCL call is an out-of-memory, a device error NCCL reports is the device's, and a watchdog
timeout is a timeout although its text also says "NCCL".

Pure: rootcause.py calls `match` on each failure's text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ..api.status_names import Reason

Class = Literal["user", "infrastructure"]

CUDA_OOM = "cuda-oom"
GPU_DEVICE = "gpu-device"
NCCL_TIMEOUT = "nccl-timeout"
GLOO_TIMEOUT = "gloo-timeout"
NCCL_COMM = "nccl-comm"
QUOTE_LIMIT = 240
# Kinds that mean "a collective did not complete": the rank that never arrived is the cause.
COLLECTIVE_KINDS = frozenset((NCCL_TIMEOUT, GLOO_TIMEOUT, NCCL_COMM))


@dataclass(frozen=True)
class FailureKind:
    kind: str  # status.failure.kind
    reason: str  # status.failure.reason, and the Failed condition's reason for a user error
    klass: Class
    node: bool  # the node is to blame: the next attempt avoids it
    action: str  # what the operator does (docs/failures.md)
    patterns: tuple[re.Pattern[str], ...]

    def matches(self, text: str) -> bool:
        return any(p.search(text) for p in self.patterns)

    def quote(self, text: str, limit: int = QUOTE_LIMIT) -> str | None:
        """The first line of ``text`` that says this kind, at most ``limit`` characters (a
        watchdog's line, buried in a stderr tail, for the message): without c10's log prefixes
        (``[rank0]:[E1127 05:43:03.899 ProcessGroupNCCL.cpp:2119] [PG ID 0 ...]``), and from
        where it says it when the line is still too long."""
        for line in text.splitlines():
            found = next((m for p in self.patterns if (m := p.search(line))), None)
            if found is None:
                continue
            line = _LOG_PREFIX.sub("", line).strip()
            if len(line) > limit:
                line = line[line.find(found.group(0)) :] if found.group(0) in line else line
            return line if len(line) <= limit else line[: limit - 3] + "..."
        return None


# c10's log line prefixes: "[rank0]:[E1127 05:43:03.899076653 ProcessGroupNCCL.cpp:2119] "
# then "[PG ID 0 PG GUID 0(default_pg) Rank 0] " (torch 2.11, captured on 2 x H200).
_LOG_PREFIX = re.compile(r"^(?:\s*\[[^\]\n]*\]:?)+\s*")


def _re(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.IGNORECASE) for p in patterns)


TABLE: tuple[FailureKind, ...] = (
    FailureKind(
        CUDA_OOM,
        Reason.CUDA_OUT_OF_MEMORY,
        "user",
        False,
        "fails the job (no restart: the same model and batch need the same memory); the "
        "message names the rank, the GPU and what was asked",
        _re(
            # torch's caching allocator: "torch.OutOfMemoryError: CUDA out of memory. Tried to
            # allocate 20.00 GiB. GPU 1 has a total capacity of ..."
            r"\bCUDA out of memory\b",
            # a CUDA call outside the allocator: "CUDA error: out of memory"
            r"\bCUDA error: out of memory\b",
            r"\bCUBLAS_STATUS_ALLOC_FAILED\b",
            r"\bcudaErrorMemoryAllocation\b",
        ),
    ),
    FailureKind(
        GPU_DEVICE,
        Reason.GPU_DEVICE_ERROR,
        "infrastructure",
        True,
        "restarts the gang; the next attempt keeps off the node (node anti-affinity)",
        _re(
            # cudaErrorECCUncorrectable and cudaErrorNvlinkUncorrectable (cudaGetErrorString)
            r"\buncorrectable ECC error\b",
            r"\buncorrectable NVLink error\b",
            r"\bcudaError(ECCUncorrectable|NvlinkUncorrectable|HardwareStackError|Contained)\b",
            r"\bhardware stack error\b",
            # the kernel driver's words for a lost GPU (dmesg: "NVRM: Xid (PCI:...): 79, ...
            # GPU has fallen off the bus."; nvidia-smi: "GPU is lost")
            r"\bfallen off the bus\b",
            r"\bGPU is lost\b",
            r"\bNVRM: Xid\b",
            r"\bXid \(PCI:",
            # a device the runtime no longer reaches
            r"CUDA-capable device\(s\) is/are busy or unavailable",
        ),
    ),
    FailureKind(
        NCCL_TIMEOUT,
        Reason.NCCL_TIMEOUT,
        "infrastructure",
        False,
        "names the rank that was not in the collective (from the stacks the launchers dump on "
        "the first communication failure), else the rank that timed out; restarts the gang",
        _re(
            # ProcessGroupNCCL's watchdog: "[Rank 0] Watchdog caught collective operation
            # timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE, ...) ran for 20004 milliseconds
            # before timing out."
            r"Watchdog caught collective operation timeout",
            r"\bWorkNCCL\(.*\) ran for \d+ milliseconds before timing out",
            # its heartbeat monitor, when the watchdog itself is stuck
            r"watchdog got stuck for \d+ seconds",
        ),
    ),
    FailureKind(
        GLOO_TIMEOUT,
        Reason.GLOO_TIMEOUT,
        "infrastructure",
        False,
        "as an NCCL timeout: names the rank that was not in the collective; restarts the gang",
        _re(
            # gloo's tcp transport: "[.../gloo/transport/tcp/unbound_buffer.cc:81] Timed out
            # waiting 5000ms for recv operation to complete"
            r"gloo/.*\] Timed out waiting \d+ms",
            r"Timed out waiting \d+ms for (recv|send) operation to complete",
        ),
    ),
    FailureKind(
        NCCL_COMM,
        Reason.NCCL_ERROR,
        "infrastructure",
        False,
        "a consequence of another rank's failure, never preferred as the root cause; names the "
        "rank that was not in the collective when the stacks show one; restarts the gang",
        _re(
            # ncclRemoteError, as ncclGetErrorString and torch's detail say it
            r"remote process exited or there was a network error",
            r"\bncclRemoteError\b",
            r"remote process exiting prematurely",
            # ncclSystemError, ncclInternalError, ncclUnhandledCudaError
            r"unhandled system error",
            r"\bnccl(SystemError|InternalError|UnhandledCudaError)\b",
            r"unhandled cuda error",
            # NCCL's socket transport
            r"Connection closed by remote peer",
            r"NCCL communicator was aborted",
        ),
    ),
)

# gloo's lost peer ("[.../gloo/transport/tcp/pair.cc:561] Connection closed by peer") is no
# kind of its own: it stays the launcher's `comm` (CommunicationError), a consequence.

BY_KIND = {k.kind: k for k in TABLE}


def match(text: str | None) -> FailureKind | None:
    """The first table entry one of whose patterns is in ``text`` (a worker's recorded error
    and stderr tail, or a launcher's message), None when none is."""
    if not text:
        return None
    return next((k for k in TABLE if k.matches(text)), None)
