"""Which failure caused the others, and whether restarting can help.

Every node's torchrun names its own first failure; the survivors of a real crash die a
moment later of closed connections or torchrun's SIGTERM. So: the earliest failure across
all nodes, except that within WINDOW seconds (node clocks agree only to NTP precision) a
recorded exception wins over a signal, a communication error or a bare exit code.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..launcher import contract
from . import failurekinds
from .failurekinds import COLLECTIVE_KINDS, FailureKind
from .observe import KIND_REASONS, OOM_KILLED, PodView, oom_killed_worker, truncate
from .worker_stderr import MESSAGE_LIMIT, failure_message

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
    # Where: for a recorded exception, the frame of the user's code that raised it; for a hang
    # or a collective that did not complete, where the rank outside any collective is.
    location: str | None = None
    stderr: str | None = None  # the last lines of the worker's stderr, when the launcher sent them
    # What the failure's text says (reconcile/failurekinds.py): a CUDA out-of-memory, an NCCL
    # timeout, a device error...; status.failure.kind when set.
    says: str | None = None
    # After a communication failure: the ranks of the pod its launcher found outside any
    # collective, as (rank, "file:line in function" or None).
    outside: tuple[tuple[int, str | None], ...] = ()
    # When the launcher wrote the report `at` is from, on the same node clock as `at`: how long
    # before its report the failure was (reconcile/failure/settle.on_operator_clock).
    reported_at: float | None = None

    @property
    def table(self) -> FailureKind | None:
        return failurekinds.BY_KIND.get(self.says or "")

    @property
    def shown_kind(self) -> str:
        """status.failure.kind: what the text says, else how the rank ended."""
        return self.says or self.kind


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
    if pod.reason == OOM_KILLED:
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


def _says(*texts: object) -> FailureKind | None:
    return failurekinds.match("\n".join(t for t in texts if isinstance(t, str)))


def _outside(report: Mapping[str, Any]) -> tuple[tuple[int, str | None], ...]:
    stacks = report.get("stacks")
    out = []
    for s in stacks if isinstance(stacks, list) else []:
        if isinstance(s, dict) and not s.get("inCollective"):
            rank = _int_or_none(s.get("rank"))
            at = s.get("at")
            if rank is not None:
                out.append((rank, at if isinstance(at, str) else None))
    return tuple(out)


def _raised_at(f: Mapping[str, Any], kind: Kind, says: FailureKind | None) -> str | None:
    """Where the user's code raised a recorded exception (failures[].location). Not for a
    collective that did not complete: its location names the rank outside the collective
    (never_arrived), not the place one that gave up waited in."""
    place = f.get("location")
    if kind != contract.KIND_EXCEPTION or (says and says.kind in COLLECTIVE_KINDS):
        return None
    return place if isinstance(place, str) and place else None


def located(message: str | None, location: str | None, limit: int = MESSAGE_LIMIT) -> str | None:
    """`message` with where the user's code raised it beside its first line, the exception's:
    "KeyError: 'x' (at /workspace/train.py:9 in <module>)". That line is shortened as far as
    it must be for the two to fit in `limit` characters (MESSAGE_LIMIT: room for the event's
    prefix, so the place survives there too)."""
    if not location:
        return message
    suffix = f"(at {location})"
    first, sep, rest = (message or "").partition("\n")
    if first:
        first = (truncate(first, limit - len(suffix) - 1) or "") + " "
    return first + suffix + sep + rest


def pod_candidates(
    node_index: int, pod: PodView, finished: float | None, now: float
) -> list[Candidate]:
    """Failures of one Failed pod: from the launcher report if it has one, else from the
    pod and container status (OOMKilled, Evicted, a bare exit code)."""
    at = finished if finished is not None else now
    report: Mapping[str, Any] = pod.report or {}
    state = report.get("state")
    group_rank = _int_or_none(report.get("groupRank"))
    outside = _outside(report)
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
        says = None if kind == "oom" else _says(f.get("error"), f.get("stderr"))
        reason = OOM_KILLED if kind == "oom" else says.reason if says else _REASONS[kind]
        place = _raised_at(f, kind, says)
        out.append(
            Candidate(
                node_index,
                pod.name,
                pod.node,
                kind,
                reason,
                _float(f.get("at")) or at,
                rank=_int_or_none(f.get("rank")),
                exit_code=_int_or_none(f.get("exitCode")),
                message=truncate(
                    located(
                        failure_message(
                            f.get("error"),
                            f.get("stderr"),
                            says=says.quote(str(f.get("stderr") or "")) if says else None,
                        ),
                        place,
                    )
                ),
                node_rank=group_rank,
                location=place,
                stderr=f.get("stderr") if isinstance(f.get("stderr"), str) else None,
                says=says.kind if says else None,
                outside=outside,
                reported_at=_float(report.get("reportedAt")),
            )
        )
    if out:
        return out
    pod_kind = _pod_kind(pod, state, report.get("message"))
    says = _says(report.get("message")) if pod_kind in (contract.KIND_COMM, "launcher") else None
    reason = (
        pod.disruption
        or pod.reason
        or (says.reason if says else None)
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
            says=says.kind if says else None,
            outside=outside,
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
    # A worker stopped by SIGTERM is one torchrun stopped because another failed (torch 2.15
    # reports those too): a consequence as well, and one that says less than a communication
    # error (a timeout names the collective that did not complete).
    pool = (
        [c for c in window if c.kind == contract.KIND_EXCEPTION]
        or [c for c in window if not _consequence(c)]
        or [c for c in window if c.kind == contract.KIND_COMM]
        or window
    )
    cause = min(pool, key=lambda c: (c.at, c.rank if c.rank is not None else 1 << 62, c.node_index))
    return never_arrived(cause, candidates)


_VOICES = (failurekinds.NCCL_TIMEOUT, failurekinds.GLOO_TIMEOUT, failurekinds.NCCL_COMM)


def _consequence(c: Candidate) -> bool:
    return c.kind == contract.KIND_COMM or (
        c.kind == contract.KIND_SIGNAL and c.exit_code == -signal.SIGTERM
    )


def collective(c: Candidate) -> bool:
    """A failure that says a collective did not complete (a timeout, a peer gone)."""
    return c.says in COLLECTIVE_KINDS or c.kind == contract.KIND_COMM


def absentee_unknown(cause: Candidate, candidates: list[Candidate]) -> bool:
    """A collective that did not complete, and no launcher has named a rank outside it yet:
    the pods still running hold that rank, and their launchers name it once they end."""
    return collective(cause) and not any(c.outside for c in candidates)


def never_arrived(cause: Candidate, candidates: list[Candidate]) -> Candidate:
    """When the cause is a collective that did not complete, the rank some launcher found
    outside any collective is the one the others waited for: it is named instead (the lowest
    such rank), with where it was and what the first rank to give up said."""
    if not collective(cause):
        return cause
    found = [(rank, at, c) for c in candidates for rank, at in c.outside if rank != cause.rank]
    if not found:
        return cause
    rank, at, c = min(found, key=lambda f: f[0])
    # Who gave up and what it said: a timeout says more than a lost connection or store.
    told = [x for x in candidates if x.says in _VOICES]
    voice = min(told, key=lambda x: (_VOICES.index(x.says or ""), x.at)) if told else cause
    text = voice.message or ""
    said = voice.table.quote(text) if voice.table else None
    first = said or (text.strip().splitlines()[0] if text.strip() else "")
    where = f" at {at}" if at else ""
    gave_up = f"rank {voice.rank}" if voice.rank is not None else f"pod {voice.pod}"
    message = (
        f"rank {rank} (pod {c.pod}) was not in the collective{where} when {gave_up} "
        f"failed: {first or voice.reason} (full stacks in the pod logs)"
    )
    says = voice.says or failurekinds.NCCL_COMM
    return Candidate(
        node_index=c.node_index,
        pod=c.pod,
        node=c.node,
        kind=cause.kind,
        reason=voice.reason,
        at=cause.at,
        rank=rank,
        message=truncate(message),
        node_rank=c.node_rank,
        location=at,
        says=says,
    )


def classify(cause: Candidate, retryable_exit_codes: list[int]) -> Class:
    """User errors fail the job; infrastructure failures are worth a gang restart."""
    if cause.kind in ("rendezvous", "launcher"):
        return "user"
    if cause.exit_code is not None and cause.exit_code in retryable_exit_codes:
        return "infrastructure"
    if cause.table is not None:
        return cause.table.klass
    if cause.kind == contract.KIND_EXCEPTION:
        return "user"
    if (
        cause.kind == contract.KIND_EXIT
        and cause.exit_code is not None
        and 1 <= cause.exit_code <= 127
    ):
        return "user"
    return "infrastructure"
