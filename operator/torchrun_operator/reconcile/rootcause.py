"""Which failure caused the others, and whether restarting can help.

Every node's torchrun names its own first failure; the survivors of a real crash die a
moment later of closed connections or torchrun's SIGTERM. So: the earliest failure across
all nodes, except that within WINDOW seconds (node clocks agree only to NTP precision) a
recorded exception wins over a signal, a communication error or a bare exit code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..launcher import launcher as contract
from .observe import KIND_REASONS, OOM_KILLED, PodView, oom_killed_worker, truncate
from .worker_stderr import failure_message

WINDOW = 5.0

# The launcher's failure kinds, and those only the operator sees.
Kind = Literal[
    contract.FailureKind,
    "rendezvous",
    "launcher",
    "oom",
    "evicted",
    "lost",
    "stalled",
]
Class = Literal["user", "infrastructure"]

_REASONS = KIND_REASONS


@dataclass(frozen=True)
class Candidate:
    node_index: int
    pod: str
    node: str | None
    kind: Kind
    reason: str
    at: float
    rank: int | None = None
    exit_code: int | None = None
    message: str | None = None
    node_rank: int | None = None  # torchrun's node rank of the pod, when known
    location: str | None = None  # a hang: where the rank outside any collective is
    stderr: str | None = None  # the last lines of the worker's stderr, when the launcher sent them


def _float(value: object) -> float | None:
    """A failure's time, if finite (podinput checked it; a NaN would make the earliest
    failure undefined and the status unwritable)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _report_kind(value: object) -> contract.FailureKind:
    for kind in contract.KIND_ORDER:
        if value == kind:
            return kind
    return contract.KIND_EXIT


def _message_kind(message: object) -> Kind | None:
    """An agent whose peer went away fails with no worker failure of its own, only a
    message: the launcher's own classifier says whether it is a communication error."""
    text = str(message or "")
    if contract.is_comm_error(text):
        return contract.KIND_COMM
    if "SIGTERM" in text or "signal" in text.lower():
        return contract.KIND_SIGNAL
    return None


def _pod_kind(pod: PodView, state: object, message: object = None) -> Kind:
    if pod.reason == "OOMKilled":
        return "oom"
    if pod.reason == "Evicted" or pod.disruption:
        return "evicted"
    if state == contract.ERROR:
        return "launcher"
    if state == contract.FAILED and (kind := _message_kind(message)) is not None:
        return kind
    if pod.exit_code is None:
        return "lost"
    if pod.exit_code >= 128 or pod.exit_code < 0:
        return contract.KIND_SIGNAL
    return contract.KIND_EXIT


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def pod_candidates(
    node_index: int, pod: PodView, finished: float | None, now: float
) -> list[Candidate]:
    """Failures of one Failed pod: from the launcher report if it has one, else from the
    pod and container status (OOMKilled, Evicted, a bare exit code)."""
    at = finished if finished is not None else now
    report: Mapping[str, Any] = pod.report or {}
    state = report.get("state")
    group_rank = _int_or_none(report.get("groupRank"))
    if state in (contract.RENDEZVOUS_TIMEOUT, contract.DNS_TIMEOUT):
        return [
            Candidate(
                node_index,
                pod.name,
                pod.node,
                "rendezvous",
                str(state),
                at,
                exit_code=pod.exit_code,
                message=truncate(str(report.get("message") or "")) or pod.message,
                node_rank=group_rank,
            )
        ]
    out: list[Candidate] = []
    failures = report.get("failures")
    for f in failures if isinstance(failures, list) else []:
        if not isinstance(f, dict):
            continue
        kind = "oom" if oom_killed_worker(pod, f) else _report_kind(f.get("kind"))
        out.append(
            Candidate(
                node_index,
                pod.name,
                pod.node,
                kind,
                OOM_KILLED if kind == "oom" else _REASONS[kind],
                _float(f.get("at")) or at,
                rank=_int_or_none(f.get("rank")),
                exit_code=_int_or_none(f.get("exitCode")),
                message=truncate(failure_message(f.get("error"), f.get("stderr"))),
                node_rank=group_rank,
                stderr=f.get("stderr") if isinstance(f.get("stderr"), str) else None,
            )
        )
    if out:
        return out
    pod_kind = _pod_kind(pod, state, report.get("message"))
    reason = (
        pod.disruption
        or pod.reason
        or ("LauncherError" if pod_kind == "launcher" else _REASONS.get(pod_kind, "PodFailed"))
    )
    return [
        Candidate(
            node_index,
            pod.name,
            pod.node,
            pod_kind,
            reason,
            at,
            exit_code=pod.exit_code,
            message=pod.message,
            node_rank=group_rank,
        )
    ]


def lost_candidate(
    node_index: int, pod_name: str, node: str | None, reason: str, at: float
) -> Candidate:
    """A pod that vanished, is being deleted, or sits on a lost node."""
    return Candidate(
        node_index=node_index,
        pod=pod_name,
        node=node,
        kind="lost",
        reason=reason,
        at=at,
        message=f"pod {pod_name}: {reason}",
    )


def root_cause(candidates: list[Candidate]) -> Candidate:
    t0 = min(c.at for c in candidates)
    window = [c for c in candidates if c.at <= t0 + WINDOW]
    # A communication error is a consequence of another failure, never its cause: it loses
    # to any other failure in the window, even one stamped later (torchrun stamps a failure
    # without an error file in whole seconds, a recorded error to the millisecond).
    pool = (
        [c for c in window if c.kind == contract.KIND_EXCEPTION]
        or [c for c in window if c.kind != contract.KIND_COMM]
        or window
    )
    return min(pool, key=lambda c: (c.at, c.rank if c.rank is not None else 1 << 62, c.node_index))


def classify(cause: Candidate, retryable_exit_codes: list[int]) -> Class:
    """User errors fail the job; infrastructure failures are worth a gang restart."""
    if cause.kind in ("rendezvous", "launcher"):
        return "user"
    if cause.exit_code is not None and cause.exit_code in retryable_exit_codes:
        return "infrastructure"
    if cause.kind == contract.KIND_EXCEPTION:
        return "user"
    if (
        cause.kind == contract.KIND_EXIT
        and cause.exit_code is not None
        and 1 <= cause.exit_code <= 127
    ):
        return "user"
    return "infrastructure"
