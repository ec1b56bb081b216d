"""The control-plane benchmark (bench/scale) end to end on tiny workloads: its own localkube
cluster with KWOK fake GPU nodes, our operator, Kubeflow's training-operator, Kubeflow Trainer
v2 + JobSet and the direct client, at the anchors' default client limits (every workload) and
at limits raised to ours (the smallest workload only: limits.SMOKE_RAISED, which keeps the smoke
near its cost with one setting). Every job must reach Succeeded (the benchmark exits non-zero
otherwise) and the tables must hold every figure for every workload they ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.scale import limits, report  # noqa: E402
from bench.scale.workloads import DIRECT, KUBEFLOW, OPERATORS, OURS, SMOKE, TRAINER  # noqa: E402


# A guard against a hang, not a speed test: 270 s alone, 373 s beside two other xdist workers.
@pytest.mark.timeout(900)
def test_bench_scale_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "cluster"), str(REPO / "operator")])
    proc = subprocess.run(
        [sys.executable, "-m", "bench.scale", "--smoke", "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads(out.read_text())
    assert list(data["meta"]["limits"]) == [limits.DEFAULTS, limits.RAISED]
    assert list(data["results"][limits.RAISED]) == sorted(limits.SMOKE_RAISED)
    for setting in limits.SETTINGS:
        assert limits.TITLES[setting] in proc.stdout
        for name, got in data["results"][setting].items():
            w = next(x for x in SMOKE if x.name == name)
            for kind in OPERATORS:
                assert got[kind]["jobs_succeeded"] == w.jobs, (setting, kind, name, got[kind])
                assert got[kind]["kcm_cpu_s"] is not None, (setting, kind, name)
            # Trainer's pods are created by the Job controller, counted by its user agent in
            # the audit log: at least one create per pod; ours and training-operator make no
            # Jobs, so the Job controller sends nothing for them.
            trainer = got[TRAINER]
            assert trainer["job_controller_requests_by_verb"].get("create", 0) >= w.nodes, (
                setting, name, trainer.get("kcm_requests_by_controller"),
            )  # fmt: skip
            assert got[OURS]["job_controller_requests_per_job"] == 0
            assert got[KUBEFLOW]["job_controller_requests_per_job"] == 0
    results = data["results"][limits.DEFAULTS]
    for w in SMOKE:
        got = results[w.name]
        for kind in OPERATORS:
            assert got[kind]["jobs_succeeded"] == w.jobs, (kind, w.name, got[kind])
            assert got[kind]["pods"] == w.pods, (kind, w.name)
        assert got[DIRECT]["pods_running_s"] is not None
        # The table has a row for every figure, and the figures are there for both.
        rows = report.rows(w, got)
        expected = [
            k for k, _, _ in report.FIGURES if w.gang_restart or not k.startswith("restart")
        ]
        assert len(rows) == len(expected)
        both = ["pods_created_s", "pods_running_s", "jobs_running_s", "api_requests_per_job"]
        both += ["cpu_s", "peak_rss_mib", "status_lag_max_s", "finish_lag_max_s"]
        both += ["restart_s", "restart_pods_replaced"] if w.gang_restart else []
        for key in both:
            for kind in OPERATORS:
                assert got[kind].get(key) is not None, (w.name, kind, key, got[kind])
        for key in expected:
            assert report.value(got[OURS], key) is not None, (w.name, key)
        assert f"== {w.name}" in proc.stdout
    big = results["big"]
    # Our gang restart replaces every pod, and so does JobSet's (a new Job); training-operator
    # replaces the failed one.
    assert big[OURS]["restart_pods_replaced"] == SMOKE[0].nodes
    assert big[TRAINER]["restart_pods_replaced"] == SMOKE[0].nodes
    assert big[KUBEFLOW]["restart_pods_replaced"] == 1
    assert big[TRAINER]["restart_status_noticed_s"] is not None
    # Both of Trainer's processes are counted, each under its own user.
    assert set(big[TRAINER]["api_requests_by_user"]) == {
        "bench-trainer-controller-manager",
        "bench-jobset-controller",
    }
    assert all(n > 0 for n in big[TRAINER]["api_requests_by_user"].values())
