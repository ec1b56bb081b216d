"""The benchmark's like-for-like runs, their pure parts: the flags each operator and
kube-controller-manager get at the two client-limit settings, the order of the runs, counting
kube-controller-manager's requests by controller (user agent), and the tables of both settings
in the printed report and the README section."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torchrun_operator import main as operator_main  # noqa: E402

from bench.scale import audit, limits, readme, report  # noqa: E402
from bench.scale.workloads import (  # noqa: E402
    DIRECT,
    FULL,
    KUBEFLOW,
    OPERATORS,
    OURS,
    SMOKE,
    TRAINER,
    Workload,
)

KCM_AGENT = "kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/1a2b3c4"


def test_raised_limits_are_our_operators_own_defaults() -> None:
    """RAISED gives the anchors exactly what our operator runs with when given no flag, so
    the raised table is like for like even if our defaults change."""
    ours = operator_main.parse([])
    to = limits.ours(ours.workers)
    assert (to.qps, to.burst) == (ours.kube_api_qps, ours.kube_api_burst)
    assert limits.kubeflow_flags(limits.RAISED, ours.workers) == [
        f"--controller-threads={ours.workers}",
        f"--kube-api-qps={int(ours.kube_api_qps)}",
        f"--kube-api-burst={ours.kube_api_burst}",
    ]
    assert limits.controller_manager_flags(limits.RAISED, ours.workers) == [
        f"--kube-api-qps={int(ours.kube_api_qps)}",
        f"--kube-api-burst={ours.kube_api_burst}",
        f"--concurrent-job-syncs={ours.workers}",
    ]
    # Ours runs at its defaults: no limit flag at all.
    assert limits.flags(OURS, limits.RAISED, 16) == []


def test_defaults_leave_the_anchors_as_released_and_limit_ours_to_theirs() -> None:
    assert limits.flags(KUBEFLOW, limits.DEFAULTS, 16) == []
    assert limits.controller_manager_flags(limits.DEFAULTS, 16) == []
    flags = limits.flags(OURS, limits.DEFAULTS, 16)
    assert flags == ["--kube-api-qps=20", "--kube-api-burst=30"]
    # The operator accepts them, and they are the limits it then runs at.
    args = operator_main.parse(flags)
    assert (args.kube_api_qps, args.kube_api_burst) == (limits.ANCHOR_QPS, limits.ANCHOR_BURST)


def test_trainer_and_jobset_processes_get_no_flags_and_the_report_says_why() -> None:
    for setting in limits.SETTINGS:
        assert limits.flags(TRAINER, setting, 16) == []
    assert "not applied" in limits.NOT_RAISED[TRAINER]
    raised = limits.describe(limits.RAISED, 16)[TRAINER]
    assert "--concurrent-job-syncs=16" in raised and "--kube-api-qps=50" in raised


def test_plan_runs_the_direct_client_once_and_every_operator_at_both_settings() -> None:
    kinds = [DIRECT, *OPERATORS]
    got = limits.plan(FULL, kinds)
    assert got == [(limits.DEFAULTS, FULL, kinds), (limits.RAISED, FULL, OPERATORS)]
    smoke = limits.plan(SMOKE, kinds, limits.SMOKE_RAISED)
    assert [w.name for w in smoke[1][1]] == ["small"]
    assert limits.plan(FULL, [DIRECT]) == [(limits.DEFAULTS, FULL, [DIRECT])]


def test_agent_name_is_the_controller_client_goes_names() -> None:
    assert audit.agent_name(f"{KCM_AGENT}/job-controller") == audit.JOB_CONTROLLER
    assert audit.agent_name(f"{KCM_AGENT}/shared-informers") == "shared-informers"
    assert audit.agent_name(KCM_AGENT) == ""
    assert audit.agent_name("python-requests/2.32") == ""
    assert audit.agent_name("") == ""


def _event(user: str, agent: str, ts: str, verb: str = "create", res: str = "pods") -> str:
    return json.dumps({
        "user": {"username": user}, "userAgent": agent, "verb": verb,
        "requestReceivedTimestamp": ts, "objectRef": {"resource": res},
    })  # fmt: skip


def test_count_by_agent_splits_one_users_requests_by_controller() -> None:
    start = 1767225600.0  # 2026-01-01T00:00:00Z
    lines = [
        _event("kcm", f"{KCM_AGENT}/job-controller", "2026-01-01T00:00:01Z"),
        _event("kcm", f"{KCM_AGENT}/job-controller", "2026-01-01T00:00:02Z", "patch", "jobs"),
        _event("kcm", f"{KCM_AGENT}/shared-informers", "2026-01-01T00:00:03Z", "watch"),
        _event("kcm", f"{KCM_AGENT}/job-controller", "2026-01-01T00:00:09Z"),  # after the end
        _event("admin", f"{KCM_AGENT}/job-controller", "2026-01-01T00:00:01Z"),  # other user
    ]
    got = audit.count_by_agent(lines, "kcm", start, start + 5)
    assert set(got) == {"job-controller", "shared-informers"}
    job = got["job-controller"]
    assert job.total == 2 and job.by_verb == {"create": 1, "patch": 1}
    assert job.by_resource == {"pods": 1, "jobs": 1}
    assert audit.total(got.values()).total == audit.count(lines, "kcm", start, start + 5).total


def test_operator_plus_job_controller_requests_are_summed_per_job() -> None:
    row = {"api_requests_per_job": 33.0, "job_controller_requests_per_job": 1040.5}
    assert report.value(row, "requests_with_job_controller_per_job") == 1073.5
    assert (
        report.value({"api_requests_per_job": 10.0}, "requests_with_job_controller_per_job") is None
    )


def _result(x: float) -> dict[str, Any]:
    return {"pods_created_s": x, "pods_running_s": x, "api_requests_per_job": x,
            "job_controller_requests_per_job": 0.0, "kcm_cpu_s": x}  # fmt: skip


def _data() -> dict[str, Any]:
    loads = [Workload("big", 1, 8, 10), Workload("small", 4, 1, 5)]
    results = {
        limits.DEFAULTS: {
            w.name: {
                DIRECT: _result(1.5),
                OURS: _result(2.0),
                KUBEFLOW: _result(4.0),
                TRAINER: _result(8.0),
            }  # fmt: skip
            for w in loads
        },
        limits.RAISED: {
            "small": {OURS: _result(3.0), KUBEFLOW: _result(6.0), TRAINER: _result(9.0)}
        },  # fmt: skip
    }
    return {
        "meta": {
            "date": "2026-11-27 10:00 UTC", "machine": "2 cores", "total_s": 600.0,
            "workloads": [w.__dict__ for w in loads],
            "limits": {s: limits.describe(s, 16) for s in limits.SETTINGS},
        },
        "results": results,
    }  # fmt: skip


def _row(table: str, label: str) -> list[str]:
    line = next(x for x in table.splitlines() if x.startswith(f"| {label}"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_readme_has_both_settings_tables_in_order_with_their_limits() -> None:
    section = readme.readme_section(_data())
    head_d, head_r = (f"### {limits.TITLES[s]}" for s in limits.SETTINGS)
    assert section.index(head_d) < section.index(head_r)
    defaults, raised = section.split(head_d)[1].split(head_r)
    assert "**big**" in defaults and "**small**" in defaults
    assert "**small**" in raised and "**big**" not in raised  # only what ran at RAISED
    assert "--controller-threads=16" in raised.split("**small**")[0]  # its limits line
    assert "QPS 20 / burst 30" in defaults.split("**big**")[0]
    # The raised table: its own figures, ratios to its own ours, the direct client's from the
    # one run of it (at DEFAULTS).
    row = _row(raised, "apply -> all pods created (s)")
    assert row[1:] == ["3.00", "6.00", "2.00x", "9.00", "3.00x", "1.50"]
    assert _row(raised, "kube-controller-manager CPU, all its controllers (s)")[1:4] == [
        "3.00", "6.00", "2.00x",
    ]  # fmt: skip
    assert "two client-limit settings" in section


def test_printed_report_has_both_settings_tables() -> None:
    text = "\n".join(readme.tables_section(_data(), text=True))
    assert text.index(limits.TITLES[limits.DEFAULTS]) < text.index(limits.TITLES[limits.RAISED])
    assert "== big: 1 x 8 = 8 pods, defaults" in text
    assert "== small: 4 x 1 = 4 pods, raised" in text
    assert "== big: 1 x 8 = 8 pods, raised" not in text


def test_a_results_file_from_before_the_two_settings_renders_as_one_table() -> None:
    data = _data()
    del data["meta"]["limits"]
    data["results"] = data["results"][limits.DEFAULTS]
    assert report.by_setting(data) == [("", data["results"])]
    section = readme.readme_section(data)
    assert readme.LEGACY_TITLE in section and limits.TITLES[limits.RAISED] not in section
    tables = section.split("How it runs")[0]
    assert "two client-limit settings" not in tables
    assert _row(section, "apply -> all pods created (s)")[1:] == [
        "2.00", "4.00", "2.00x", "8.00", "4.00x", "1.50",
    ]  # fmt: skip
