"""Failures no launcher reports: who never joined a rendezvous, and training that went quiet.

Pods have no API access: readiness and the launcher's read-only status endpoint are what a
running launcher tells the operator. Ready means "rendezvous done, training"
(docs/pod-contract.md). From it, from the reports of the pods that did end, and from the
stacks the launchers of stalled pods dumped, these pure functions find

* the pods that did not arrive at a rendezvous that never completed: not created,
  Pending (unschedulable), Running but never Ready with no report (a stuck launcher), or
  failed before joining; the pods whose launcher reported `RendezvousTimeout` did arrive and
  waited for the others;
* when a rendezvous has hung with no launcher report at all (every launcher stuck): all pods
  Running, not all Ready, for longer than the join timeout and a margin;
* training that stopped progressing (opt-in, `runPolicy.progressTimeoutSeconds`, see
  docs/progress.md): the launcher removes its `ready` file when the script's step counter
  stops changing, so a pod that was Ready at rendezvous turns NotReady while still Running;
  its launcher has every worker dump its Python stacks, and the rank that is not inside a
  collective (the one the others wait for) is named with its file and line.

Every timer here runs on the operator's clock: node clocks may be off by any amount (an hour
ahead would silence progressTimeoutSeconds, one far behind would fail a rendezvousing gang at
once). So they count from when the operator first saw a pod Running, and NotReady
(`Watched`, kept in status.ranks[] so that an operator restart neither loses nor restarts
them), never from the kubelet's or the launcher's times. A timer that starts when the
operator first sees the change can only start late, never early: a restarted operator, or
one that was away, fires no false hang.

Pods are named by their index (`<job>-<i>`), which is not torchrun's node rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any

from ..api.timefmt import fmt, seconds
from ..launcher import contract
from .observe import Live, PodView, StackSummary

# After every pod is Running, launchers get joinTimeoutSeconds to rendezvous; the margin
# covers their DNS wait (negative DNS caching included) and the readiness probe's period.
RENDEZVOUS_MARGIN_SECONDS = 30.0
# The trainer's readiness probe period (render/pod.py). A pod counts as stalled once it has
# been NotReady for two periods: one slow `cat` under load is not a hang.
PROBE_PERIOD_SECONDS = 5.0
STALL_GRACE_SECONDS = 2 * PROBE_PERIOD_SECONDS

# Launcher reports of pods that took part in the rendezvous: they timed out waiting, or lost
# the store when its host gave up first.
ARRIVED_STATES = (contract.RENDEZVOUS_TIMEOUT, contract.FAILED)


# status.ranks[] fields: when the operator first saw the pod Running, and (while it is
# Running and not Ready) when it first saw it NotReady since it was last Ready; its own clock.
RUNNING_SEEN = "runningObservedAt"
NOT_READY_SEEN = "notReadyObservedAt"


def _same_pod(pod: PodView, before: Mapping[str, Any]) -> Mapping[str, Any]:
    """`before` (the status.ranks[] entry the status had) while it is about `pod`, else {}."""
    return before if before.get("pod") == pod.name else {}


def started_now(pod: PodView, before: Mapping[str, Any]) -> bool:
    """Whether the operator saw `pod` Pending when it last looked and sees it Running now
    (absent_reason's `started_now`)."""
    return pod.phase == "Running" and _same_pod(pod, before).get("phase") == "Pending"


def observed(pod: PodView, before: Mapping[str, Any], now: float) -> dict[str, str]:
    """The operator's own times for `pod`, for its status.ranks[] entry (`before`: the entry
    the status had, kept while it is about the same pod). A pod an older operator already
    saw Running has no stamp: its kubelet's start time stands in, never later than now."""
    same = _same_pod(pod, before)
    out: dict[str, str] = {}
    if same.get(RUNNING_SEEN):
        out[RUNNING_SEEN] = str(same[RUNNING_SEEN])
    elif pod.phase == "Running":
        legacy = seconds(same.get("startedAt")) if same.get("phase") == "Running" else None
        out[RUNNING_SEEN] = fmt(min(legacy, now) if legacy is not None else now)
    if pod.phase == "Running" and not pod.ready and not pod.terminating:
        out[NOT_READY_SEEN] = str(same.get(NOT_READY_SEEN) or fmt(now))
    return out


@dataclass(frozen=True)
class Watched:
    """What the operator saw of one pod, on its own clock (see `observed`)."""

    running: float | None = None
    not_ready: float | None = None


def watched(entries: Iterable[Mapping[str, Any]]) -> dict[int, Watched]:
    """Per pod index, the operator's observation times from status.ranks[]."""
    out = {}
    for e in entries:
        if isinstance(e.get("index"), int):
            out[e["index"]] = Watched(seconds(e.get(RUNNING_SEEN)), seconds(e.get(NOT_READY_SEEN)))
    return out


@dataclass(frozen=True)
class Absent:
    """A pod (by index) that did not join the rendezvous, and why."""

    node_index: int
    pod: str
    node: str | None
    why: str
    order: int = 0  # most telling first: never started, failed, then stuck


def _pending_why(pod: PodView) -> str:
    detail = ", ".join(x for x in (pod.reason, pod.message) if x)
    return f"never started (Pending{': ' + detail if detail else ''})"


def absent_reason(
    pod: PodView | None,
    seen: Watched,
    now: float,
    join_timeout: int,
    slack: float = STALL_GRACE_SECONDS,
    started_now: bool = False,
) -> tuple[int, str] | None:
    """Why this pod did not join a rendezvous, with an ordering key (lower is
    more telling); None when it did join, or may still be waiting: a Running pod without a
    report is waiting for `join_timeout` (+ `slack`) after the operator first saw it Running
    (`seen`), stuck afterwards. `started_now`: launchers already gave up waiting, and the
    operator saw this pod Pending until now; the scheduler may have bound it in the room
    they freed, so it never started in time, however it runs now."""
    if pod is None:
        return 0, "was never created"
    if pod.ready or pod.phase == "Succeeded":
        return None
    state = pod.report.get("state") if pod.report else None
    if pod.terminal and state in ARRIVED_STATES:
        return None
    if pod.terminating and not pod.terminal:
        return 1, "was deleted before it joined"
    if pod.phase == "Pending":
        return 0, _pending_why(pod)
    if pod.phase == "Running" and started_now:
        return 0, "never started in time (Pending until the others gave up waiting)"
    if pod.phase == "Running":
        if seen.running is not None and now < seen.running + join_timeout + slack:
            return None
        return 2, "is Running but never joined (no Ready, no report from its launcher)"
    if pod.phase == "Failed":
        return 1, f"failed before it joined ({state or pod.reason or 'no report'})"
    return 1, f"did not join ({pod.phase})"


def absentees(
    pods: Mapping[int, tuple[str, PodView | None]],
    seen: Mapping[int, Watched],
    now: float,
    join_timeout: int,
    started_now: Set[int] = frozenset(),
) -> list[Absent]:
    """Pods (index -> (pod name, observed pod)) that did not arrive, most telling first
    (never started, then failed, then stuck), by index within each. `started_now`: the
    indexes of pods the operator saw Pending until now, when launchers already gave up."""
    out = []
    for i in sorted(pods):
        name, pod = pods[i]
        watched = seen.get(i, Watched())
        found = absent_reason(pod, watched, now, join_timeout, started_now=i in started_now)
        if found is not None:
            order, why = found
            out.append(Absent(i, name, pod.node if pod else None, why, order))
    return sorted(out, key=lambda a: (a.order, a.node_index))


def describe_absent(absent: list[Absent]) -> str:
    parts = [f"pod {a.pod} (index {a.node_index}) {a.why}" for a in absent]
    return "; ".join(parts)


def _pods(pods: list[str]) -> str:
    return f"{'pod' if len(pods) == 1 else 'pods'} {', '.join(pods)}"


def rendezvous_timeout_message(absent: list[Absent], waited: list[str], join_timeout: int) -> str:
    """The message of a rendezvous that launchers reported as timed out; `waited` names the
    pods that arrived."""
    text = f"rendezvous did not complete: {describe_absent(absent)}"
    if waited:
        text += f"; {_pods(waited)} waited joinTimeoutSeconds ({join_timeout}s) for it"
    return text


def rendezvous_hang_deadline(
    pods: Mapping[int, PodView | None],
    seen: Mapping[int, Watched],
    rendezvous_done: bool,
    join_timeout: int,
) -> float | None:
    """When a rendezvous that no launcher reported on counts as hung: not every pod Ready,
    and joinTimeoutSeconds + a margin gone since the operator first saw the last Running pod
    Running (`seen`). Pods that never
    started count as absent: when the one that never starts is pod 0, the store host, the
    others wait for its DNS name (dnsTimeoutSeconds, 300 s by default) and report nothing in
    time. None when that does not apply (yet): no pod Running, or one already ended (its
    launcher's report decides) or is being deleted."""
    if rendezvous_done or not pods:
        return None
    starts = []
    for i, pod in pods.items():
        if pod is None or pod.phase in ("Pending", "") or pod.phase is None:
            continue
        if pod.phase != "Running" or pod.terminating:
            return None
        started = seen.get(i, Watched()).running
        if started is None:
            return None
        starts.append(started)
    if not starts:
        return None
    if len(starts) == len(pods) and all(p is not None and p.ready for p in pods.values()):
        return None
    return max(starts) + join_timeout + RENDEZVOUS_MARGIN_SECONDS


def rendezvous_hang_message(absent: list[Absent], join_timeout: int) -> str:
    return (
        f"rendezvous did not complete within joinTimeoutSeconds ({join_timeout}s) + "
        f"{RENDEZVOUS_MARGIN_SECONDS:g}s of the last pod running, and no launcher reported: "
        f"{describe_absent(absent)}"
    )


@dataclass(frozen=True)
class Quiet:
    """A pod that was training and went NotReady: its launcher saw no progress."""

    node_index: int
    pod: str
    node: str | None
    since: float  # when the operator first saw it NotReady (its own clock)
    node_rank: int | None = None


def quiet_pods(
    pods: Mapping[int, PodView],
    seen: Mapping[int, Watched],
    rendezvous_at: float | None,
    node_ranks: Mapping[int, int] | None = None,
) -> list[Quiet]:
    """Running pods that took part in the rendezvous (seen Running by the time it completed,
    `rendezvous_at`, both on the operator's clock) and are NotReady now, earliest first.
    Elastic replacements that joined later are not judged. `node_ranks`: torchrun's node
    rank per index, where known, for the messages."""
    if rendezvous_at is None:
        return []
    out = []
    for i, pod in pods.items():
        if pod.phase != "Running" or pod.terminating or pod.ready:
            continue
        started, since = seen.get(i, Watched()).running, seen.get(i, Watched()).not_ready
        if started is None or started > rendezvous_at or since is None:
            continue
        rank = (node_ranks or {}).get(i)
        out.append(Quiet(i, pod.name, pod.node, max(since, rendezvous_at), rank))
    return sorted(out, key=lambda q: (q.since, q.node_index))


def stalled(quiet: list[Quiet], now: float) -> tuple[list[Quiet], float | None]:
    """The quiet pods past the grace period, and (if none is yet) when the next one will be."""
    due = [q for q in quiet if now >= q.since + STALL_GRACE_SECONDS]
    if due:
        return due, None
    pending = [q.since + STALL_GRACE_SECONDS - now for q in quiet]
    return [], min(pending) if pending else None


def stall_message(due: list[Quiet], timeout: int) -> str:
    who = "; ".join(f"{_where(q)} NotReady since {fmt(q.since)}" for q in due)
    return (
        f"{_pods([q.pod for q in due])} reported no training progress for "
        f"runPolicy.progressTimeoutSeconds ({timeout}s): {who}"
    )


def _where(q: Quiet) -> str:
    parts = [f"index {q.node_index}"]
    if q.node_rank is not None:
        parts.append(f"node rank {q.node_rank}")
    if q.node:
        parts.append(f"node {q.node}")
    return f"pod {q.pod} ({', '.join(parts)})"


def outside_collective(
    pods: Mapping[int, tuple[str, Live | None]],
    seen: Mapping[int, Watched],
) -> tuple[int, StackSummary, bool] | None:
    """From the stacks the launchers of stalled pods dumped (docs/progress.md): the rank that
    is not inside a collective, with its pod's index, and whether other ranks wait in one;
    None when there are no stacks or every rank is inside one. The pod the operator saw
    NotReady first (its own clock: the launchers' stall times come from node clocks), then
    the lowest rank."""
    found: list[tuple[float, int, int, StackSummary]] = []
    waiting = False
    for i, (_, live) in pods.items():
        if live is None or live.stall_at is None:
            continue
        since = seen.get(i, Watched()).not_ready
        for stack in live.stacks:
            if stack.in_collective:
                waiting = True
            else:
                found.append((since if since is not None else live.at, stack.rank, i, stack))
    if not found:
        return None
    _, _, index, stack = min(found, key=lambda f: (f[0], f[1]))
    return index, stack, waiting


def culprit_message(stack: StackSummary, pod: str, others_waiting: bool) -> str:
    at = f" at {stack.location}" if stack.location else ""
    others = " while other ranks wait in one" if others_waiting else ""
    return (
        f"rank {stack.rank} (pod {pod}) is not inside a collective{at}{others} "
        "(full stacks in the pod logs)"
    )
