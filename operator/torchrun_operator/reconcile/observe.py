"""Read what a pod says about itself: phase, readiness, the launcher's final report, and what
its launcher's status endpoint said while it ran (the live rank map and progress)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api import names
from ..api.ranks import format_ranks
from ..api.status_names import RankPhase, Reason
from ..api.timefmt import fmt, restamp
from ..launcher import contract
from . import failurekinds, podinput
from .podinput import CheckpointReport, LiveAnswer, Rejected

TERMINAL = ("Succeeded", "Failed")  # pod phases
MAX_MESSAGE = 512  # per-rank messages are truncated to keep the status small

# Launcher failure kinds as status reasons.
KIND_REASONS: dict[str, str] = {
    contract.KIND_EXCEPTION: Reason.EXCEPTION,
    contract.KIND_SIGNAL: Reason.SIGNAL,
    contract.KIND_COMM: Reason.COMMUNICATION_ERROR,
    contract.KIND_EXIT: Reason.NON_ZERO_EXIT,
}


OOM_KILLED = "OOMKilled"
# torchrun's exit code for a worker that died of SIGKILL.
SIGKILL_EXIT = -9


def oom_killed_worker(pod: PodView, failure: dict[str, Any]) -> bool:
    """A worker the kernel's OOM killer took. The launcher is the container's PID 1 and
    survives: the killer picks the largest process in the cgroup, a worker, and torchrun
    reports it killed by SIGKILL; the runtime then reports the whole container OOMKilled (an
    OOM kill happened in its cgroup). Seen on a real kubelet with containerd."""
    return (
        pod.reason == OOM_KILLED
        and failure.get("kind") == contract.KIND_SIGNAL
        and failure.get("exitCode") == SIGKILL_EXIT
    )


def truncate(text: str | None, limit: int = MAX_MESSAGE) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_report(message: object) -> contract.Summary | None:
    """The launcher's termination message, checked and bounded (reconcile/podinput.py), or
    None if missing, garbled or refused."""
    report = podinput.parse_report(message)
    return None if isinstance(report, Rejected) else report


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
    node_index: int | None  # the pod's index (label torchrun.dev/index)
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
    report: contract.Summary | None
    disruption: str | None  # reason of a DisruptionTarget=True condition
    ready_since: object = None  # lastTransitionTime of the Ready condition
    uid: str | None = None
    ip: str | None = None
    # Why the pod's termination message was refused (reconcile/podinput.py), if it was.
    report_rejected: str | None = None
    # The nodes its rendered node affinity keeps it off (status.avoidedNodes when it was
    # created; the annotation render/placement.py writes).
    avoided: frozenset[str] = frozenset()

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def global_ranks(self) -> list[int]:
        ranks = self.report.get("ranks") if self.report else None
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
    annotations = meta.get("annotations") or {}
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
    index = labels.get(names.LABEL_INDEX, labels.get(names.LABEL_NODE_RANK))
    report = podinput.parse_report(term.get("message"))
    return PodView(
        name=meta.get("name", ""),
        node_index=_int(index),
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
        report=None if isinstance(report, Rejected) else report,
        disruption=disruption.get("reason") if disruption.get("status") == "True" else None,
        ready_since=(conditions.get("Ready") or {}).get("lastTransitionTime"),
        uid=meta.get("uid"),
        ip=status.get("podIP"),
        report_rejected=report.reason if isinstance(report, Rejected) else None,
        avoided=podinput.avoided_nodes(annotations.get(names.ANNOTATION_AVOIDED_NODES)),
    )


def confined(v: PodView, mount: str | None) -> PodView:
    """`v`, its report refused (podinput.misplaced_checkpoint) when the checkpoint in it lies
    outside the job's checkpoint storage (`mount`: spec.checkpoint.mountPath, None if none):
    the pod then ends on its exit code, as with any refused report."""
    found = v.report.get("checkpoint") if v.report is not None else None
    path = found.get("path") if isinstance(found, Mapping) else None
    refused = podinput.misplaced_checkpoint(path if isinstance(path, str) else None, mount)
    if refused is None:
        return v
    return dataclasses.replace(v, report=None, report_rejected=refused.reason)


# ---- the launcher's status endpoint (docs/pod-contract.md) -----------------------------------


def _nonneg_int(value: object) -> int | None:
    """A non-negative count from the status written before (the operator's own, but an
    older operator may have copied a pod's number into it unchecked)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= podinput.MAX_COUNT:
        return value
    return None


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


StackSummary = podinput.Stack


@dataclass(frozen=True)
class Live:
    """What a running pod's launcher answered on GET /status, read at `at` (operator clock),
    as bound to the pod by parse_live: an answer can only ever describe that pod."""

    at: float
    state: str | None = None
    group_rank: int | None = None
    ranks: list[int] = field(default_factory=list)
    round: int | None = None
    restarts: int | None = None
    step: int | None = None
    total: int | None = None
    steps_per_second: float | None = None
    step_seconds: float | None = None
    last_step_at: float | None = None
    window_full: bool = False
    stall_at: float | None = None
    stacks: list[StackSummary] = field(default_factory=list)
    checkpoint: CheckpointReport | None = None

    @property
    def rendezvoused(self) -> bool:
        return podinput.rendezvoused(self.group_rank, self.state)


def parse_live(
    read: object, rdzv_id: str | None, index: int | None, mount: str | None = None
) -> Live | Rejected | None:
    """A reader's result ({"at": <operator clock>, "data": the answer, validated by
    podinput (a LiveAnswer) or still to be (a decoded JSON object)}) as Live; None when it
    was refused (the reader says so) or is from another pod or attempt (an IP reused by another
    pod); Rejected when its checkpoint lies outside the job's checkpoint storage (`mount`,
    spec.checkpoint.mountPath: podinput.misplaced_checkpoint)."""
    if not isinstance(read, Mapping):
        return None
    at, data = _number(read.get("at")), read.get("data")
    answer = data if isinstance(data, LiveAnswer | Rejected) else podinput.live_answer(data)
    if at is None or isinstance(answer, Rejected):
        return None
    if rdzv_id is not None and answer.rdzv_id != rdzv_id:
        return None
    if index is not None and answer.index != index:
        return None
    path = answer.checkpoint.path if answer.checkpoint is not None else None
    refused = podinput.misplaced_checkpoint(path, mount)
    if refused is not None:
        return refused
    # A pod may only speak for its own workers' stacks.
    own = set(answer.ranks)
    return Live(
        at=at,
        state=answer.state,
        group_rank=answer.group_rank,
        ranks=list(answer.ranks),
        round=answer.round,
        restarts=answer.restarts,
        step=answer.step,
        total=answer.total,
        steps_per_second=answer.steps_per_second,
        step_seconds=answer.step_seconds,
        last_step_at=answer.last_step_at,
        window_full=answer.window_full,
        stall_at=answer.stall_at,
        stacks=[s for s in answer.stacks if s.rank in own],
        checkpoint=answer.checkpoint,
    )


def _rate(value: object) -> float | None:
    t = _number(value)
    return t if t is not None and t >= 0 else None


def _sig3(value: float) -> float:
    """Three significant digits: enough to read, and the status does not change with noise."""
    return float(f"{value:.3g}")


def rank_entry(
    index: int,
    pod: PodView,
    live: Live | None = None,
    before: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One compact status.ranks entry; unset fields are left out. What the pod knows about
    its rendezvous comes from its launcher's final report, else what its status endpoint said
    (`live`), else what the status said before for the same pod (`before`)."""
    report: Mapping[str, Any] = pod.report or {}
    same: Mapping[str, Any] = before if before and before.get("pod") == pod.name else {}
    lv = live or Live(at=0.0)
    entry: dict[str, Any] = {"index": index, "pod": pod.name, "node": pod.node}

    def first(*values: object) -> Any:
        return next((v for v in values if v is not None), None)

    entry["nodeRank"] = first(
        _nonneg_int(report.get("groupRank")), lv.group_rank, _nonneg_int(same.get("nodeRank"))
    )
    if pod.global_ranks:
        entry["globalRanks"] = format_ranks(pod.global_ranks)
    elif lv.ranks:
        entry["globalRanks"] = format_ranks(lv.ranks)
    else:
        entry["globalRanks"] = same.get("globalRanks")
    entry["round"] = first(
        _nonneg_int(report.get("round")), lv.round, _nonneg_int(same.get("round"))
    )
    entry["phase"] = RankPhase.TERMINATING if pod.terminating and not pod.terminal else pod.phase
    entry["ready"] = pod.ready
    entry["restarts"] = first(
        _nonneg_int(report.get("restarts")), lv.restarts, _nonneg_int(same.get("restarts"))
    )
    entry["exitCode"] = pod.exit_code
    if pod.phase != "Succeeded":
        state = report.get("state")
        entry["reason"] = state if state and state != contract.FAILED else pod.reason
        failures = report.get("failures")
        if isinstance(failures, list) and failures and isinstance(failures[0], dict):
            entry["reason"] = KIND_REASONS.get(str(failures[0].get("kind")), entry["reason"])
            says = failurekinds.match(
                "\n".join(str(failures[0].get(k) or "") for k in ("error", "stderr"))
            )
            if says is not None:  # what the GPU, NCCL or gloo said (docs/failures.md)
                entry["reason"] = says.reason
            if oom_killed_worker(pod, failures[0]):
                entry["reason"] = OOM_KILLED
            entry["message"] = truncate(str(failures[0].get("error") or "")) or pod.message
        else:
            entry["message"] = pod.message
    entry["startedAt"] = restamp(pod.started_at)
    entry["finishedAt"] = restamp(pod.finished_at)
    entry["step"] = first(_nonneg_int(report.get("step")), lv.step, _nonneg_int(same.get("step")))
    if not pod.terminal:
        rate = lv.steps_per_second if live else _rate(same.get("stepsPerSecond"))
        per_step = lv.step_seconds if live else _rate(same.get("stepSeconds"))
        entry["stepsPerSecond"] = _sig3(rate) if rate is not None else None
        entry["stepSeconds"] = _sig3(per_step) if per_step is not None else None
    last = fmt(lv.last_step_at) if lv.last_step_at is not None else None
    entry["lastStepAt"] = last or same.get("lastStepAt")
    return {k: v for k, v in entry.items() if v is not None}
