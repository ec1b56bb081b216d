"""status.lastCheckpoint from what the running pods' launchers report: the highest step wins,
it survives attempts (a new attempt's pods report none at first), and its time is the
operator's, stamped when first seen."""

from __future__ import annotations

from torchrun_operator.reconcile.observe import Live
from torchrun_operator.reconcile.podinput import CheckpointReport
from torchrun_operator.reconcile.progress import checkpoints, last_checkpoint

T1, T2 = "2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z"


def live(step: int, path: str, at: float = 1.0) -> list[CheckpointReport]:
    return checkpoints({0: Live(at=at, checkpoint=CheckpointReport(step, path, at))}, [])


def test_running_pods_report_at_their_endpoint_and_ended_ones_in_their_report() -> None:
    running = {0: Live(at=1.0, checkpoint=CheckpointReport(10, "/c/10", 1.0)), 1: Live(at=1.0)}
    ended = [
        None,
        {"state": "Succeeded"},
        {"state": "Succeeded", "checkpoint": {"step": 30, "path": "/c/30"}},
    ]
    found = checkpoints(running, ended)
    assert [(c.step, c.path) for c in found] == [(10, "/c/10"), (30, "/c/30")]
    # a pod's final checkpoint (saved on SIGTERM, say) is the job's though no live read saw it
    assert last_checkpoint(found, {"step": 10, "path": "/c/10", "time": T1}, T2) == {
        "step": 30,
        "path": "/c/30",
        "time": T2,
    }


def test_the_highest_step_any_pod_reported_is_the_jobs_checkpoint() -> None:
    got = last_checkpoint(live(10, "/c/10") + live(20, "/c/20"), None, T1)
    assert got == {"step": 20, "path": "/c/20", "time": T1}
    assert last_checkpoint(checkpoints({0: Live(at=1.0)}, [None]), None, T1) is None


def test_it_is_kept_across_attempts_and_its_time_is_when_first_seen() -> None:
    before = {"step": 20, "path": "/c/20", "time": T1}
    assert last_checkpoint([], before, T2) == before  # a fresh attempt reports none yet
    assert last_checkpoint(live(20, "/c/20"), before, T2) == before  # seen again
    assert last_checkpoint(live(10, "/c/10"), before, T2) == before  # older
    assert last_checkpoint(live(30, "/c/30"), before, T2) == {
        "step": 30,
        "path": "/c/30",
        "time": T2,
    }
    # the same step saved elsewhere (a resumed attempt saved again) is the newer one
    assert last_checkpoint(live(20, "/d/20"), before, T2) == {
        "step": 20,
        "path": "/d/20",
        "time": T2,
    }
