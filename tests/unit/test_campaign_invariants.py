"""The fault campaign's invariants (tests/campaign_invariants.py) catch what they are for:
each is fed a hand-made record that breaks it, and one that keeps it."""

from __future__ import annotations

from typing import Any

from campaign_invariants import (
    PodEvent,
    attempts_mixed,
    fault_kills,
    outcome_differs,
    pods_per_attempt,
    tracebacks,
    unexpected_exits,
)
from torchrun_operator.api.names import LABEL_ATTEMPT


def ev(type_: str, name: str, attempt: int, terminating: bool = False, uid: str = "") -> PodEvent:
    return PodEvent(type_, name, uid or name, attempt, terminating)


def gang_restart(*, wait_for_gone: bool) -> list[PodEvent]:
    """Attempt 0's two pods, deleted; attempt 1's two pods created (after they are gone,
    or, the bug, as soon as they are deleting)."""
    events = [
        ev("ADDED", "j-0", 0),
        ev("ADDED", "j-1", 0),
        ev("MODIFIED", "j-0", 0, terminating=True),
        ev("MODIFIED", "j-1", 0, terminating=True),
    ]
    gone = [ev("DELETED", "j-0", 0, True), ev("DELETED", "j-1", 0, True)]
    new = [ev("ADDED", "j-0-a1", 1), ev("ADDED", "j-1-a1", 1)]
    return events + (gone + new if wait_for_gone else new + gone)


def test_pod_event_reads_the_attempt_label_and_deletion() -> None:
    pod: dict[str, Any] = {
        "metadata": {
            "name": "j-0-a2",
            "uid": "u1",
            "labels": {LABEL_ATTEMPT: "2"},
            "deletionTimestamp": "2026-01-01T00:00:00Z",
        },
        "status": {"phase": "Running"},
    }
    assert PodEvent.of("MODIFIED", pod) == PodEvent("MODIFIED", "j-0-a2", "u1", 2, True, "Running")
    assert PodEvent.of("ADDED", {"metadata": {"name": "x"}}).attempt is None


def test_a_new_attempt_created_only_after_the_old_pods_are_gone_keeps_attempts_apart() -> None:
    assert attempts_mixed(gang_restart(wait_for_gone=True)) == []


def test_a_new_attempt_created_beside_the_old_pods_is_caught_even_while_they_terminate() -> None:
    found = attempts_mixed(gang_restart(wait_for_gone=False))
    assert len(found) == 2
    assert "j-0-a1 of attempt 1 created while ['j-0', 'j-1'] exist" in found[0]


def test_a_finished_pod_of_the_old_attempt_left_in_place_is_caught() -> None:
    events = [ev("ADDED", "j-0", 0), ev("ADDED", "j-0-a1", 1)]
    assert attempts_mixed(events) == ["pod j-0-a1 of attempt 1 created while ['j-0'] exist"]


def test_a_late_pod_of_an_older_attempt_must_be_deleted() -> None:
    running = [ev("ADDED", "j-0-a1", 1), ev("ADDED", "j-1-a1", 1)]
    late = ev("ADDED", "j-1", 0)
    assert attempts_mixed([*running, late, ev("MODIFIED", "j-1", 0, True)]) == []
    assert attempts_mixed([*running, late, ev("DELETED", "j-1", 0)]) == []
    assert attempts_mixed([*running, late]) == [
        "pod j-1 of attempt 0 turned up beside ['j-0-a1', 'j-1-a1'] and was never deleted"
    ]


def test_pods_per_attempt_counts_each_pod_once_and_allows_counted_replacements() -> None:
    events = [
        ev("ADDED", "j-0", 0),
        ev("MODIFIED", "j-0", 0),
        ev("ADDED", "j-1", 0),
        ev("ADDED", "j-1r1", 0),
    ]
    replaced = {"restarts": [{"attempt": 0, "kind": "replacement"}]}
    assert pods_per_attempt(events, 2, replaced) == []
    # The same replacement in another attempt, or a gang restart, does not allow a third pod.
    restarted = {
        "restarts": [{"attempt": 1, "kind": "replacement"}, {"attempt": 0, "kind": "user"}]
    }
    assert pods_per_attempt(events, 2, restarted) == [
        "attempt 0: 3 pods created, at most 2 allowed"
    ]


def test_a_pod_created_twice_for_one_slot_is_caught() -> None:
    events = [
        ev("ADDED", "j-0", 0, uid="a"),
        ev("ADDED", "j-1", 0),
        ev("DELETED", "j-0", 0, uid="a"),
        ev("ADDED", "j-0", 0, uid="b"),
    ]
    assert pods_per_attempt(events, 2, {}) == ["attempt 0: 3 pods created, at most 2 allowed"]


def test_a_create_committed_late_into_an_ended_attempt_is_judged_by_attempts_mixed() -> None:
    """kueue-evict-32: attempt 0's create of j-0 timed out, the retry made j-0, the eviction
    deleted both pods, attempt 1 began, and the first create then landed (a second j-0 of
    attempt 0). Not a double create; it must be deleted."""
    events = [
        ev("ADDED", "j-0", 0, uid="retry"),
        ev("ADDED", "j-1", 0),
        ev("DELETED", "j-0", 0, uid="retry"),
        ev("DELETED", "j-1", 0),
        ev("ADDED", "j-0-a1", 1),
        ev("ADDED", "j-1-a1", 1),
        ev("ADDED", "j-0", 0, uid="late"),
    ]
    assert pods_per_attempt(events, 2, {}) == []
    assert attempts_mixed(events) == [
        "pod j-0 of attempt 0 turned up beside ['j-0-a1', 'j-1-a1'] and was never deleted"
    ]
    deleted = [*events, ev("DELETED", "j-0", 0, uid="late")]
    assert attempts_mixed(deleted) == []
    # Before any newer attempt exists, a second pod for the slot still counts.
    assert pods_per_attempt(events[:4] + events[6:], 2, {}) == [
        "attempt 0: 3 pods created, at most 2 allowed"
    ]


def test_a_pod_without_an_attempt_label_is_caught() -> None:
    events = [ev("ADDED", "j-0", 0), PodEvent("ADDED", "stray", "s", None, False)]
    assert pods_per_attempt(events, 2, {}) == ["attempt None: 1 pods created, at most 2 allowed"]


def test_outcome_differs_names_each_field_that_differs() -> None:
    ref = {"phase": "Succeeded", "counters": {"restarts": 0}, "attempt": 0}
    assert outcome_differs(ref, dict(ref)) == []
    got = {**ref, "counters": {"restarts": 1}}
    assert outcome_differs(ref, got) == [
        "outcome counters: {'restarts': 1}, fault-free run: {'restarts': 0}"
    ]


def test_tracebacks_are_found_with_the_exception_they_end_in() -> None:
    log = (
        "INFO started\n"
        "ERROR reconcile of ('ns', 'j') failed\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "    raise KeyError('status')\n"
        "KeyError: 'status'\n"
        "INFO later\n"
    )
    assert tracebacks(log, "operator-1.log") == ["traceback in operator-1.log: KeyError: 'status'"]
    assert tracebacks("INFO reconcile of j: API error 500; retrying\n", "x") == []


def test_only_exits_from_a_kill_fault_that_fired_are_expected() -> None:
    fired = [
        {"pid": 11, "action": "kill_after", "rule": 0},
        {"pid": 12, "action": "status", "rule": 1},
    ]
    killed = fault_kills(fired)
    assert killed == {11}
    assert unexpected_exits([(11, -9)], killed) == []
    assert unexpected_exits([(12, -9), (11, 1)], killed) == [
        "operator 12 exited by itself (status -9)",
        "operator 11 exited by itself (status 1)",
    ]
