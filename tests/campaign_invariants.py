"""The fault campaign's invariants (tests/integration/faultrun.py), as pure checks over what a
run recorded: the pod watch's events, the job's status, the operators' logs and exits; and
`outcome`, the record of a run's result that the fault-free run's is compared with.

Each check returns the violations it finds, as sentences for people; none of them can only pass
(tests/unit/test_campaign_invariants.py feeds each one a stream that breaks it). Kept here,
in the folder both suites import from, so the unit tests need no cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torchrun_operator.api.names import LABEL_ATTEMPT

KILL_ACTIONS = frozenset({"kill_before", "kill_after"})


@dataclass(frozen=True)
class PodEvent:
    """One pod watch event, as much of it as the checks need."""

    type: str  # ADDED, MODIFIED or DELETED
    name: str
    uid: str
    attempt: int | None
    terminating: bool
    phase: str | None = None

    @classmethod
    def of(cls, type_: str, pod: Mapping[str, Any]) -> PodEvent:
        meta = pod.get("metadata") or {}
        raw = (meta.get("labels") or {}).get(LABEL_ATTEMPT)
        attempt = int(raw) if isinstance(raw, str) and raw.isdigit() else None
        return cls(
            type=type_,
            name=meta.get("name", "?"),
            uid=meta.get("uid", meta.get("name", "?")),
            attempt=attempt,
            terminating=meta.get("deletionTimestamp") is not None,
            phase=(pod.get("status") or {}).get("phase"),
        )


def attempts_mixed(events: Iterable[PodEvent]) -> list[str]:
    """No pod of an older attempt alive beside a newer attempt's pod.

    The operator creates an attempt's pods only once every pod of the earlier attempts is
    gone (they share hostnames, so DNS names and the rendezvous host): a pod of attempt b
    created while one of attempt a < b still exists, deleting or not, is a violation. A pod
    of an older attempt can still turn up later (a create the apiserver committed after the
    client gave up, a deposed leader's): it must then be deleted, not left to run beside
    the newer gang until the end of the run."""
    out: list[str] = []
    pods: dict[str, PodEvent] = {}
    late: dict[str, str] = {}  # uid -> what was said of an older pod beside newer ones
    for e in events:
        if e.type == "DELETED":
            pods.pop(e.uid, None)
            late.pop(e.uid, None)
            continue
        new = e.uid not in pods
        pods[e.uid] = e
        if e.terminating:
            late.pop(e.uid, None)
        if not new or e.attempt is None:
            continue
        older = sorted(
            p.name for p in pods.values() if p.attempt is not None and p.attempt < e.attempt
        )
        if older:
            out.append(f"pod {e.name} of attempt {e.attempt} created while {older} exist")
        newer = sorted(
            p.name for p in pods.values() if p.attempt is not None and p.attempt > e.attempt
        )
        if newer and not e.terminating:
            late[e.uid] = f"pod {e.name} of attempt {e.attempt} turned up beside {newer}"
    out += [f"{said} and was never deleted" for said in late.values()]
    return out


def replacements(status: Mapping[str, Any]) -> Counter[Any]:
    """Elastic replacements per attempt, as the status's restart records count them."""
    return Counter(
        r.get("attempt")
        for r in status.get("restarts") or []
        if isinstance(r, Mapping) and r.get("kind") == "replacement"
    )


def pods_per_attempt(
    events: Iterable[PodEvent], nodes: int, status: Mapping[str, Any]
) -> list[str]:
    """Pods created per attempt <= nodes plus the replacements the status counts in it: a
    pod created twice for one slot (a retry that did not see its first create) is a pod
    that holds a node's GPUs without being accounted for.

    A pod of an attempt that turns up once a newer attempt's pods exist is not counted here:
    it is a create the apiserver committed after the client gave up, landing in a slot the
    end of its attempt had freed (kueue-evict-32 of 2026-11-27), which no operator can
    refuse. attempts_mixed requires it to be deleted."""
    created: dict[int | None, set[str]] = {}
    newest: int | None = None
    for e in events:
        if e.type != "ADDED":
            continue
        if e.attempt is not None and newest is not None and e.attempt < newest:
            continue  # late: attempts_mixed's
        if e.attempt is not None:
            newest = e.attempt if newest is None else max(newest, e.attempt)
        created.setdefault(e.attempt, set()).add(e.uid)
    allowed = replacements(status)
    out = []
    for attempt, uids in sorted(created.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        limit = nodes + (allowed[attempt] if attempt is not None else 0)
        if attempt is None or len(uids) > limit:
            out.append(f"attempt {attempt}: {len(uids)} pods created, at most {limit} allowed")
    return out


def outcome(job: Mapping[str, Any]) -> dict[str, Any]:
    """A run's outcome, from its job's final status: what must not depend on faults (phase,
    attempt, root cause, counters, restart history), the record outcome_differs compares."""
    st = job.get("status") or {}
    failure = st.get("failure") or {}
    return {
        "phase": st.get("phase"),
        "attempt": st.get("attempt"),
        "counters": st.get("counters"),
        # Which pod holds which ranks is c10d's choice (by address): compare the rank and
        # what went wrong, not where.
        "failure": {k: failure.get(k) for k in ("rank", "kind", "reason", "exitCode")},
        "restarts": [
            (r.get("attempt"), r.get("kind"), r.get("reason")) for r in st.get("restarts") or []
        ],
    }


def outcome_differs(reference: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    """The outcome (as `outcome` builds it) equals the fault-free run's: one sentence per
    field that does not."""
    return [
        f"outcome {key}: {got.get(key)!r}, fault-free run: {reference.get(key)!r}"
        for key in sorted(set(reference) | set(got))
        if reference.get(key) != got.get(key)
    ]


def tracebacks(log: str, where: str) -> list[str]:
    """No traceback in the operator's log: each one is an error nobody handled."""
    lines = log.splitlines()
    out = []
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            last = next((x for x in lines[i + 1 :] if x and not x.startswith((" ", "\t"))), "")
            out.append(f"traceback in {where}: {last.strip()[:200]}")
    return out


def fault_kills(fault_log: Iterable[Mapping[str, Any]]) -> set[int]:
    """The pids the fault seam killed, from its log (one entry per fault fired)."""
    return {int(e["pid"]) for e in fault_log if e.get("action") in KILL_ACTIONS}


def unexpected_exits(exits: Iterable[tuple[int, int]], killed: set[int]) -> list[str]:
    """Every operator exit the campaign did not cause is a violation. `exits`: (pid, exit
    status) of each operator that ended by itself; `killed`: the pids the fault seam sent
    its SIGKILL (a kill fault that fired)."""
    return [
        f"operator {pid} exited by itself (status {code})"
        for pid, code in exits
        if not (pid in killed and code == -9)
    ]
