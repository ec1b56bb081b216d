"""Read what a pod says about its node rank: phase, readiness, the launcher's report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..api import names
from ..api.ranks import format_ranks
from .timefmt import fmt, parse

TERMINAL = ("Succeeded", "Failed")
MAX_MESSAGE = 512  # per-rank messages are truncated to keep the status small

# Launcher failure kinds as status reasons.
KIND_REASONS: dict[str, str] = {
    "exception": "Exception",
    "signal": "Signal",
    "comm": "CommunicationError",
    "exit": "NonZeroExit",
}


def truncate(text: str | None, limit: int = MAX_MESSAGE) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_report(message: object) -> dict[str, Any] | None:
    """The launcher's termination-message JSON, or None if missing or garbled."""
    if not isinstance(message, str) or not message.strip():
        return None
    try:
        data = json.loads(message)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("state"), str):
        return None
    return data


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return None


@dataclass(frozen=True)
class PodView:
    """The parts of a pod the reconciler reasons about."""

    name: str
    node_index: int | None
    attempt: int | None
    owner_uid: str | None
    phase: str
    terminating: bool
    deletion_time: object
    ready: bool
    node: str | None
    reason: str | None  # pod-level reason (Evicted, ...) or the container's
    message: str | None
    exit_code: int | None
    started_at: object
    finished_at: object
    report: dict[str, Any] | None
    disruption: str | None  # reason of a DisruptionTarget=True condition
    ready_since: object = None  # lastTransitionTime of the Ready condition

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def global_ranks(self) -> list[int]:
        ranks = (self.report or {}).get("ranks")
        if not isinstance(ranks, list):
            return []
        return [r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and r >= 0]


def _container_status(pod: dict[str, Any], trainer: str | None) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == trainer:
            return dict(cs)
    return dict(statuses[0]) if statuses and trainer is None else {}


def view(pod: dict[str, Any], trainer: str | None) -> PodView:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    owner = next(
        (o.get("uid") for o in meta.get("ownerReferences") or [] if o.get("controller")), None
    )
    cs = _container_status(pod, trainer)
    state = cs.get("state") or {}
    term = state.get("terminated") or {}
    running = state.get("running") or {}
    waiting = state.get("waiting") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get("Ready") or {}).get("status") == "True"
    disruption = conditions.get("DisruptionTarget") or {}
    unscheduled = conditions.get("PodScheduled") or {}
    reason = status.get("reason") or term.get("reason") or waiting.get("reason")
    message = status.get("message") or waiting.get("message")
    if reason is None and unscheduled.get("status") == "False":
        reason, message = unscheduled.get("reason"), unscheduled.get("message")
    return PodView(
        name=meta.get("name", ""),
        node_index=_int(labels.get(names.LABEL_NODE_RANK)),
        attempt=_int(labels.get(names.LABEL_ATTEMPT)),
        owner_uid=owner,
        phase=status.get("phase") or "Pending",
        terminating=bool(meta.get("deletionTimestamp")),
        deletion_time=meta.get("deletionTimestamp"),
        ready=ready,
        node=(pod.get("spec") or {}).get("nodeName"),
        reason=reason,
        message=truncate(message),
        exit_code=_int(term.get("exitCode")) if term else None,
        started_at=running.get("startedAt") or term.get("startedAt"),
        finished_at=term.get("finishedAt"),
        report=parse_report(term.get("message")),
        disruption=disruption.get("reason") if disruption.get("status") == "True" else None,
        ready_since=(conditions.get("Ready") or {}).get("lastTransitionTime"),
    )


def rank_entry(node_index: int, pod: PodView) -> dict[str, Any]:
    """One compact status.ranks entry; unset fields are left out."""
    report = pod.report or {}
    entry: dict[str, Any] = {"nodeRank": node_index, "pod": pod.name, "node": pod.node}
    entry["phase"] = "Terminating" if pod.terminating and not pod.terminal else pod.phase
    entry["ready"] = pod.ready
    if pod.global_ranks:
        entry["globalRanks"] = format_ranks(pod.global_ranks)
    if isinstance(report.get("restarts"), int):
        entry["restarts"] = report["restarts"]
    entry["exitCode"] = pod.exit_code
    if pod.phase != "Succeeded":
        state = report.get("state")
        entry["reason"] = state if state and state != "Failed" else pod.reason
        failures = report.get("failures")
        if isinstance(failures, list) and failures and isinstance(failures[0], dict):
            entry["reason"] = KIND_REASONS.get(str(failures[0].get("kind")), entry["reason"])
            entry["message"] = truncate(str(failures[0].get("error") or "")) or pod.message
        else:
            entry["message"] = pod.message
    started, finished = parse(pod.started_at), parse(pod.finished_at)
    entry["startedAt"] = fmt(started) if started else None
    entry["finishedAt"] = fmt(finished) if finished else None
    return {k: v for k, v in entry.items() if v is not None}
