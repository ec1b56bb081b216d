"""The benchmark's arithmetic: from timestamped pod and job observations to figures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402

from bench.scale import audit, report  # noqa: E402
from bench.scale.figures import (  # noqa: E402
    JobObs,
    PodObs,
    all_running_times,
    compute,
    job_obs,
    percentile,
    status_lags,
    victim,
)
from bench.scale.workloads import KUBEFLOW, OURS, TRAINER, Workload  # noqa: E402


def pod(t: float, uid: str, phase: str, job: str = "w-0", gone: bool = False) -> PodObs:
    return PodObs(t, uid, f"pod-{uid}", job, phase, deleting=False, gone=gone)


def job(t: float, started: int, finished: int = 0, **flags: bool) -> JobObs:
    return JobObs(
        t, "w-0", flags.get("running", False), flags.get("succeeded", False), False,
        flags.get("restarting", False), started, finished,
    )  # fmt: skip


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 95) == 95.0


def test_all_running_needs_every_pod_running_at_once() -> None:
    pods = [pod(1, "a", "Running"), pod(2, "a", "Succeeded"), pod(3, "b", "Running")]
    assert all_running_times(pods, 2) == {}
    assert all_running_times([*pods[:1], pods[2]], 2) == {"w-0": 3}


def test_status_lag_is_time_until_the_job_counts_the_pod() -> None:
    pods = [pod(1.0, "a", "Running"), pod(2.0, "b", "Running"), pod(5.0, "a", "Succeeded")]
    jobs = [job(1.5, 1), job(3.0, 2), job(9.0, 2, 1)]
    lags, missed = status_lags(pods, jobs)
    assert sorted(lags) == [0.5, 1.0, 4.0] and missed == 0
    lags, missed = status_lags(pods, jobs[:1])
    assert lags == [0.5] and missed == 2


def test_job_obs_reads_both_status_shapes() -> None:
    ours = {"metadata": {"name": "j"}, "status": {"phase": "Running",
            "nodes": {"running": 3, "succeeded": 1, "failed": 0}}}  # fmt: skip
    o = job_obs(1.0, OURS, ours)
    assert (o.running, o.started, o.finished) == (True, 4, 1)
    theirs = {
        "metadata": {"name": "j"},
        "status": {
            "conditions": [{"type": "Running", "status": "False"},
                           {"type": "Succeeded", "status": "True"}],
            "replicaStatuses": {"Master": {"succeeded": 1}, "Worker": {"active": 2}},
        },
    }  # fmt: skip
    k = job_obs(1.0, KUBEFLOW, theirs)
    assert (k.running, k.succeeded, k.started, k.finished) == (False, True, 3, 1)


def test_compute_times_restart_from_failure_to_all_running_again() -> None:
    w = Workload("w", jobs=1, nodes=2, run_seconds=1, gang_restart=True)
    pods = [
        pod(1.0, "a", "Pending"), pod(1.1, "b", "Pending"),
        pod(2.0, "a", "Running"), pod(2.5, "b", "Running"),
        pod(4.0, "b", "Failed"), pod(4.5, "a", "Running", gone=True),
        pod(5.0, "c", "Running"), pod(6.0, "d", "Running"),
        pod(9.0, "c", "Succeeded"), pod(9.5, "d", "Succeeded"),
    ]  # fmt: skip
    jobs = [
        job(3.0, 2, running=True),
        job(4.2, 2, restarting=True),
        job(10.0, 2, 2, succeeded=True),
    ]
    out = compute(w, OURS, pods, jobs, t0=0.5, fault_uid="b")
    assert out["pods_created_s"] == pytest.approx(0.6)
    assert out["pods_running_s"] == pytest.approx(2.0)
    assert out["jobs_running_s"] == pytest.approx(2.5)
    assert out["restart_s"] == pytest.approx(2.0)
    assert out["restart_pods_replaced"] == 2
    assert out["restart_status_noticed_s"] == pytest.approx(0.2)
    assert out["finish_lag_max_s"] == pytest.approx(0.5)
    assert out["jobs_succeeded"] == 1


def test_audit_counts_one_users_requests_in_the_window() -> None:
    def line(user: str, ts: str, verb: str = "create") -> str:
        return (
            f'{{"user":{{"username":"{user}"}},"verb":"{verb}","requestReceivedTimestamp":"{ts}",'
            f'"objectRef":{{"resource":"pods","subresource":"status"}}}}'
        )

    lines = [
        line("op", "2026-01-01T00:00:01.000000Z"),
        line("op", "2026-01-01T00:00:05.000000Z", "patch"),
        line("other", "2026-01-01T00:00:02.000000Z"),
        line("op", "2026-01-01T00:00:09.000000Z"),
        "not json op",
    ]
    start = 1767225600.0  # 2026-01-01T00:00:00Z
    got = audit.count(lines, "op", start, start + 6)
    assert got.total == 2 and got.by_verb == {"create": 1, "patch": 1}
    assert got.by_resource == {"pods/status": 2}


def test_readme_section_is_replaced_and_the_rest_kept() -> None:
    readme = "# Benchmarks\n\n## GPU\nfigures\n"
    once = report.replace_section(readme, "## Scale\nold")
    twice = report.replace_section(once, "## Scale\nnew")
    assert "## GPU\nfigures" in twice and "new" in twice and "old" not in twice
    assert twice.count(report.BEGIN) == 1


def test_table_ratio_is_theirs_over_ours_and_has_every_row() -> None:
    w = Workload("w", jobs=1, nodes=2, run_seconds=1)
    rows = report.rows(w, {OURS: {"pods_created_s": 2.0}, KUBEFLOW: {"pods_created_s": 5.0}})
    assert rows[0][1:4] == ("2.00", "5.00", "2.50x")
    assert rows[0][4:6] == ("not run", "n/a")
    assert len(rows) == len([f for f in report.FIGURES if not f[0].startswith("restart")])


def test_victim_is_a_running_worker_and_none_once_every_pod_finished() -> None:
    pods = [pod(1, "b", "Running"), pod(1, "a", "Running"), pod(1, "c", "Running")]
    assert victim(pods, "w-0") == pods[0]  # pod-b: the second by name, never pod-a
    assert victim([*pods, pod(2, "b", "Succeeded"), pod(2, "c", "Failed")], "w-0") == pods[1]
    finished = [pod(3, u, "Succeeded") for u in "abc"]
    assert victim([*pods, *finished], "w-0") is None
    assert victim(pods, "other-job") is None


def test_a_run_with_no_pod_left_to_fail_is_named_under_its_table() -> None:
    w = Workload("big", jobs=1, nodes=2, run_seconds=1, gang_restart=True)
    results: dict[str, dict[str, Any]] = {
        OURS: {"restart_s": 3.0},
        TRAINER: {"restart_not_run": "pods finished first"},
    }
    table = report.markdown_table(w, results)
    assert table.endswith("- Trainer v2 + JobSet: no restart measured: pods finished first")
    assert "no restart measured" in report.text_table(w, results)
    assert not report.unmeasured(Workload("mid", jobs=1, nodes=2, run_seconds=1), results)
