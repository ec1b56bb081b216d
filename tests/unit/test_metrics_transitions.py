"""The metrics count what the reconciler decided: a plan's transitions, recorded once."""

from __future__ import annotations

from torchrun_operator import metrics
from torchrun_operator.api.status_names import ConditionType, Phase, RestartKind
from torchrun_operator.metrics import Metrics
from torchrun_operator.reconcile.plan import PhaseChanged, Reached, Restarted


def sample(m: Metrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(f"torchrun_operator_{name}", labels) or 0.0


def test_phase_changes_are_counted_by_the_phase_left_and_entered() -> None:
    m = Metrics()
    m.record_transitions(
        [
            PhaseChanged(Phase.PENDING, Phase.STARTING),
            PhaseChanged(Phase.STARTING, Phase.RUNNING),
            PhaseChanged(Phase.PENDING, Phase.STARTING),
        ]
    )
    assert sample(m, "phase_transitions_total", from_phase="Pending", to_phase="Starting") == 2
    assert sample(m, "phase_transitions_total", from_phase="Starting", to_phase="Running") == 1


def test_restarts_are_labelled_user_or_infrastructure() -> None:
    m = Metrics()
    m.record_transitions(
        [
            Restarted(RestartKind.INFRASTRUCTURE),
            Restarted(RestartKind.REPLACEMENT),
            Restarted(RestartKind.USER),
        ]
    )
    # An elastic replacement is the infrastructure's doing.
    assert sample(m, "restarts_total", kind="infrastructure") == 2
    assert sample(m, "restarts_total", kind="user") == 1


def test_start_up_milestones_feed_the_histograms() -> None:
    m = Metrics()
    m.record_transitions(
        [
            Reached(ConditionType.RUNNING, 3.0),
            Reached(ConditionType.RENDEZVOUS_DONE, 4.0),
            # A start the reconciler could not date (no creation time) is not observed.
            Reached(ConditionType.RUNNING, None),
        ]
    )
    assert sample(m, "time_to_running_seconds_count") == 1
    assert sample(m, "time_to_running_seconds_sum") == 3.0
    assert sample(m, "time_to_rendezvous_seconds_sum") == 4.0


def test_the_module_function_feeds_the_default_instance() -> None:
    before = sample(metrics.default, "restarts_total", kind="infrastructure")
    metrics.record_transitions([Restarted(RestartKind.INFRASTRUCTURE)])
    assert sample(metrics.default, "restarts_total", kind="infrastructure") == before + 1


def test_phase_counts_treat_a_new_job_as_pending() -> None:
    counts = metrics.phase_counts([None, {}, {"phase": "Running"}, {"phase": "Running"}])
    assert counts == {"Pending": 2, "Running": 2}
