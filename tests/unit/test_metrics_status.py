"""What a job's status change means for the metrics (pure: `metrics.status_change`)."""

from __future__ import annotations

from typing import Any

from torchrun_operator import metrics
from torchrun_operator.metrics import Metrics

CREATED = "2026-01-01T00:00:00Z"


def cond(type_: str, status: str, at: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": "x", "lastTransitionTime": at}


def test_running_and_rendezvous_measured_from_creation_once() -> None:
    starting = {"phase": "Starting", "conditions": [cond("Running", "False", CREATED)]}
    running = {
        "phase": "Running",
        "conditions": [
            cond("Running", "True", "2026-01-01T00:00:07Z"),
            cond("RendezvousDone", "True", "2026-01-01T00:00:09Z"),
        ],
    }
    change = metrics.status_change(starting, running, CREATED)
    assert change.time_to_running == 7.0
    assert change.time_to_rendezvous == 9.0
    assert change.restarts == []
    # The next status update keeps the conditions True: nothing is observed twice.
    again = metrics.status_change(running, {**running, "phase": "Succeeded"}, CREATED)
    assert again.time_to_running is None and again.time_to_rendezvous is None


def test_after_a_gang_restart_times_count_from_the_restart() -> None:
    old = {
        "attempt": 1,
        "lastRestartTime": "2026-01-01T00:10:00Z",
        "conditions": [cond("RendezvousDone", "False", "2026-01-01T00:10:00Z")],
    }
    new = {**old, "conditions": [cond("RendezvousDone", "True", "2026-01-01T00:10:04Z")]}
    assert metrics.status_change(old, new, CREATED).time_to_rendezvous == 4.0


def test_restarts_labelled_by_the_history_kind() -> None:
    old = {"counters": {"restarts": 1}, "restarts": [{"attempt": 0, "kind": "user"}]}
    new = {
        "counters": {"restarts": 3},
        "restarts": [
            {"attempt": 0, "kind": "user"},
            {"attempt": 1, "kind": "replacement"},
            {"attempt": 1, "kind": "user"},
        ],
    }
    assert metrics.status_change(old, new, CREATED).restarts == ["infrastructure", "user"]
    # A history cut short (or absent) still counts every restart, as infrastructure.
    bare = {"counters": {"restarts": 2}}
    assert metrics.status_change(None, bare, CREATED).restarts == [
        "infrastructure",
        "infrastructure",
    ]
    # Counters never go down; a status written by an older operator without them is no restart.
    assert metrics.status_change(new, {"phase": "Failed"}, CREATED).restarts == []


def test_record_status_change_feeds_the_counters_and_histograms() -> None:
    m = Metrics()
    m.record_status_change(
        metrics.StatusChange(restarts=["user"], time_to_running=3.0, time_to_rendezvous=4.0)
    )
    reg = m.registry
    assert reg.get_sample_value("torchrun_operator_restarts_total", {"kind": "user"}) == 1
    assert reg.get_sample_value("torchrun_operator_time_to_running_seconds_count") == 1
    assert reg.get_sample_value("torchrun_operator_time_to_rendezvous_seconds_sum") == 4.0


def test_phase_counts_treat_a_new_job_as_pending() -> None:
    counts = metrics.phase_counts([None, {}, {"phase": "Running"}, {"phase": "Running"}])
    assert counts == {"Pending": 2, "Running": 2}


def test_unreadable_times_and_conditions_observe_nothing() -> None:
    # A status written by another operator version must not break the metrics.
    new = {"conditions": ["junk", cond("Running", "True", "not a time")]}
    change = metrics.status_change({}, new, CREATED)
    assert change.time_to_running is None
    assert metrics.status_change({}, {"conditions": [cond("Running", "True", CREATED)]}, None) == (
        metrics.StatusChange()
    )
