"""One reconciliation's working state, shared by the reconciler and its failure policies.

`Ctx` holds the job, its parsed spec, the status being decided (a copy of the job's, changed
in place) and what the shell is to do; its methods are the only ways the decisions change the
status: conditions, phases, restart records and events. `Seen` is what the observation of the
current attempt found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..api.spec import JobSpec
from ..api.status_names import ConditionType, Phase, PodPhase, RestartKind
from ..api.timefmt import fmt, seconds
from . import budget
from . import conditions as cond
from .observe import Live, PodView
from .plan import Event, PhaseChanged, Plan, Reached, Restarted, Transition
from .rootcause import Candidate

# The longest the shell is asked to wait before looking again. Deadlines and TTLs of any
# length then cost a wake-up an hour, and no delay can overflow a timer.
MAX_REQUEUE_SECONDS = 3600.0
# How soon a job that something is blocking looks again.
BLOCKED_REQUEUE_SECONDS = 5.0
MAX_RESTART_RECORDS = 10


@dataclass
class Ctx:
    job: dict[str, Any]
    spec: JobSpec
    now: float
    status: dict[str, Any]
    pods: list[PodView]  # ours (controller uid matches), any attempt
    taken: set[str]  # every observed pod name, ours or not: never create over one
    foreign: set[str] = field(default_factory=set)  # observed pod names that are not ours
    blocked: list[str] = field(default_factory=list)  # what stands in the way, for people
    refused: list[str] = field(default_factory=list)  # pod creates the apiserver refused
    live: dict[str, Live] = field(default_factory=dict)  # pod uid -> its launcher's status
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    force_delete: list[str] = field(default_factory=list)  # reconcile/overdue.py
    events: list[Event] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    requeue: list[float] = field(default_factory=list)
    delete_job: bool = False

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def stamp(self) -> str:
        return fmt(self.now)

    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt") or 0)

    @property
    def phase(self) -> str:
        return str(self.status["phase"])

    @property
    def conds(self) -> list[dict[str, Any]]:
        conds: list[dict[str, Any]] = self.status.setdefault("conditions", [])
        return conds

    @property
    def counters(self) -> dict[str, int]:
        c: dict[str, int] = self.status.setdefault("counters", {})
        for key in ("userFailures", "infrastructureFailures", "restarts"):
            c.setdefault(key, 0)
        return c

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def set_cond(self, type_: ConditionType, status: bool, reason: str, message: str) -> bool:
        return cond.set_condition(self.conds, type_, status, reason, message, self.stamp)

    def set_phase(self, phase: Phase) -> None:
        before = self.status.get("phase")
        self.status["phase"] = phase
        if before != phase:
            self.transitions.append(PhaseChanged(str(before or Phase.PENDING), phase))

    def reached(
        self, condition: Literal[ConditionType.RUNNING, ConditionType.RENDEZVOUS_DONE]
    ) -> None:
        """The condition just turned True: measured from the start of the attempt."""
        start = seconds(self.status.get("lastRestartTime")) if self.attempt else None
        if start is None:
            start = seconds(self.job["metadata"].get("creationTimestamp"))
        # The condition's lastTransitionTime is the stamp: whole seconds, as the status has.
        at = seconds(self.stamp)
        took = None if start is None or at is None else max(0.0, at - start)
        self.transitions.append(Reached(condition, took))

    def record_restart(self, record: dict[str, Any]) -> None:
        """Append to status.restarts (the latest MAX_RESTART_RECORDS); a gang restart or an
        elastic replacement spends the budget (counters.restarts), a resume does not."""
        entry = {"attempt": self.attempt, "at": self.stamp, **record}
        history = [
            *(self.status.get("restarts") or []),
            {k: v for k, v in entry.items() if v is not None},
        ]
        self.status["restarts"] = history[-MAX_RESTART_RECORDS:]
        kind = RestartKind(record["kind"])
        if kind is not RestartKind.SUSPEND:
            self.counters["restarts"] += 1
            self.transitions.append(Restarted(kind))

    def create_pod(self, pod: dict[str, Any]) -> None:
        """Plan a create unless the name is taken; a name taken by a pod that is not ours
        blocks the job (it is never deleted: it is not ours)."""
        name = pod["metadata"]["name"]
        if name in self.foreign:
            ns = self.job["metadata"].get("namespace")
            self.blocked.append(
                f"Pod {ns}/{name} exists and is not this job's; delete or rename it"
            )
        elif name not in self.taken:
            self.create.append(pod)

    def delete_pods(self, pods: list[PodView]) -> None:
        self.delete.extend(p.name for p in pods if not p.terminating and p.name not in self.delete)

    def plan(self) -> Plan:
        positive = [r for r in self.requeue if r is not None and r == r]  # r == r: not NaN
        if self.blocked:
            positive.append(BLOCKED_REQUEUE_SECONDS)
        return Plan(
            create=[] if self.blocked else self.create,
            delete=self.delete,
            force_delete=self.force_delete,
            status=budget.bound(self.status),
            events=self.events,
            requeue_after=min(max(0.0, min(positive)), MAX_REQUEUE_SECONDS) if positive else None,
            delete_job=self.delete_job,
            transitions=self.transitions,
        )


@dataclass
class Seen:
    """The current attempt's pods by index, as one observation found them."""

    alive: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    succeeded: set[int] = field(default_factory=set)
    candidates: list[Candidate] = field(default_factory=list)
    current: dict[int, PodView] = field(default_factory=dict)
    slots: dict[int, tuple[str, PodView | None]] = field(default_factory=dict)  # name, pod
    # Pods the operator last saw Pending and sees Running now: bound this moment, perhaps in
    # the room pods that gave up on them freed (hang.absent_reason).
    started_now: set[int] = field(default_factory=set)
    # Pods deleted to be created again: kept off nodes no longer avoided (failure/avoid.py).
    recreated: set[int] = field(default_factory=set)


def renamed(record: Any) -> Any:
    """A record written before the pod index had its own field: its `nodeRank` was the pod
    index, and becomes `index`."""
    if isinstance(record, dict) and "index" not in record and "nodeRank" in record:
        out = {k: v for k, v in record.items() if k != "nodeRank"}
        out["index"] = record["nodeRank"]
        return out
    return record


def entries(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """status.ranks, each keyed by `index` (see `renamed`)."""
    return [renamed(r) for r in status.get("ranks") or []]


def node_ranks(ctx: Ctx) -> dict[int, int]:
    """Per pod index, torchrun's node rank as the status knows it."""
    return {
        int(e["index"]): int(e["nodeRank"])
        for e in entries(ctx.status)
        if isinstance(e.get("nodeRank"), int) and isinstance(e.get("index"), int)
    }


def counts(desired: int, pods: list[PodView] | None = None, failed: int = 0) -> dict[str, Any]:
    """status.nodes."""
    pods = pods or []
    ready = sum(1 for p in pods if p.ready)
    return {
        "desired": desired,
        "scheduled": sum(1 for p in pods if p.node),
        "running": sum(1 for p in pods if p.phase == PodPhase.RUNNING and not p.terminating),
        "ready": ready,
        "succeeded": sum(1 for p in pods if p.phase == PodPhase.SUCCEEDED),
        "failed": failed,
        "summary": f"{ready}/{desired}",
    }
