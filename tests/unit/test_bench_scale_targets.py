"""The benchmark's targets table (bench/scale/targets.py) judged from a results file, and our
operator's rate-limit waits read from its metrics (bench/scale/operators.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.scale import readme, report, targets  # noqa: E402
from bench.scale.operators import parse_rate_limit_wait  # noqa: E402
from bench.scale.workloads import DIRECT, KUBEFLOW, OURS  # noqa: E402


def results(**ours: Any) -> dict[str, Any]:
    big = {"name": "big", "jobs": 1, "nodes": 512, "run_seconds": 90, "gang_restart": True}
    small = {"name": "small", "jobs": 500, "nodes": 1, "run_seconds": 30, "gang_restart": False}
    mine = {
        "status_lag_p95_s": 0.5,
        "restart_s": 12.0,
        "peak_rss_mib": 100.0,
        "cpu_s": 5.0,
        "api_requests_per_job": 10.0,
        "pods_running_s": 12.0,
        **ours,
    }
    theirs = {"cpu_s": 4.0, "api_requests_per_job": 10.0, "pods_running_s": 30.0}
    direct = {"pods_running_s": 10.0}
    by_kind = {OURS: mine, KUBEFLOW: theirs}
    return {
        "meta": {
            "date": "2026-11-27 20:00 UTC",
            "machine": "2 cores",
            "total_s": 60.0,
            "workloads": [big, small],
            "limits": {"defaults": {}, "raised": {}},
        },
        "results": {
            "defaults": {"big": {**by_kind, DIRECT: direct}, "small": dict(by_kind)},
            "raised": {"big": dict(by_kind), "small": dict(by_kind)},
        },
    }


def verdicts(data: dict[str, Any], setting: str) -> dict[tuple[str, str], targets.Verdict]:
    got = dict(targets.judge(data))[setting]
    return {(v.target.key, v.workload): v for v in got}


def test_each_target_is_judged_against_its_bound_at_each_setting() -> None:
    for setting in ("defaults", "raised"):
        v = verdicts(results(), setting)
        assert v[("status_lag_p95_s", "big")].met is True
        assert v[("restart_s", "big")].met is False  # 12 s against < 10 s
        assert ("restart_s", "small") not in v  # no gang restart in that workload
        assert v[("peak_rss_mib", "big")].met is True  # <= 100 MiB
        assert v[("cpu_s", "big")].met is False  # 5 s against training-operator's 4
        assert v[("api_requests_per_job", "big")].met is True  # equal counts as met
        # 12 s against 1.2 x the direct client's 10 s, from whichever setting ran it.
        running = v[("pods_running_s", "big")]
        assert running.bound == 12.0 and running.met is True
    # The direct client ran only for big: small's bound is unknown, not met or missed.
    assert verdicts(results(), "raised")[("pods_running_s", "small")].met is None


def test_strict_targets_are_missed_at_their_bound() -> None:
    v = verdicts(results(status_lag_p95_s=1.0), "raised")
    assert v[("status_lag_p95_s", "big")].met is False


def test_the_missed_list_and_the_markdown_name_every_miss() -> None:
    data = results(peak_rss_mib=121.0)
    missed = {(v.target.key, v.workload) for v in targets.missed(data)}
    assert ("peak_rss_mib", "small") in missed and ("restart_s", "big") in missed
    text = "\n".join(targets.markdown(data))
    assert "| operator peak RSS (<= 100 MiB) | 121.0 MiB: missed | 121.0 MiB: missed |" in text
    assert "5.00 s vs 4.00: missed" in text
    assert text.count("**Targets:") == 2
    assert "### The targets, against this run" in readme.readme_section(data)


def test_the_rate_limit_wait_is_read_from_the_operators_metrics() -> None:
    exposition = "\n".join(
        [
            "# TYPE torchrun_operator_client_rate_limit_wait_seconds histogram",
            'torchrun_operator_client_rate_limit_wait_seconds_bucket{le="0.0"} 100.0',
            "torchrun_operator_client_rate_limit_wait_seconds_count 4500.0",
            "torchrun_operator_client_rate_limit_wait_seconds_sum 812.5",
            "torchrun_operator_reconcile_duration_seconds_sum 3.0",
        ]
    )
    assert parse_rate_limit_wait(exposition) == (812.5, 4500)
    assert parse_rate_limit_wait("torchrun_operator_reconcile_duration_seconds_sum 3.0") is None
    fig = {"rate_limit_wait_sum_s": 812.5, "rate_limit_requests": 4500}
    assert report.value(fig, "rate_limit_wait_mean_s") == 0.181
    assert report.value({}, "rate_limit_wait_mean_s") is None
