"""The hostile-pods benchmark (bench/hostile_pods.py) end to end on a tiny size: its own
localkube cluster with KWOK fake nodes, our operator reading every pod through the stub server,
two hostile jobs and a victim job. It checks the harness and that the report has its fields
(never the figures, which belong to the full run on a known machine): both runs reached every
job Running, the stub answered each pod with its own binding (the victim's status shows its
steps, so its lag was measured), and hostile answers were refused by the operator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import hostile_pods  # noqa: E402


def test_bench_hostile_smoke(tmp_path: Path) -> None:
    out = tmp_path / "hostile.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "cluster"), str(REPO / "operator")])
    # Five hostile pods (their shapes, hashed from their names: deep, sentinel, slow, wide,
    # sentinel); no RSS limit, the figures are not checked here.
    argv = ["--jobs", "1", "--nodes", "5", "--victim-nodes", "2", "--window", "20",
            "--settle", "5", "--timeout", "240", "--rss-limit", "100000",
            "--out", str(out)]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "bench.hostile_pods", *argv],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert set(runs) == {"hostile", "baseline"}
    for label, run in runs.items():
        for key, _ in hostile_pods.FIELDS:
            assert key in run, (label, key)
        assert run["pods"] == 7
        assert run["peak_rss_mib"] > 0
        # The victim's steps reached its status: each answer carried the victim pod's binding.
        assert run["victim_lag_samples"] > 0, (label, run)
        assert run["victim_lag_p50_s"] is not None and run["victim_lag_p95_s"] is not None
    # Hostile bodies were answered and the operator said it refused some (PodInputRejected).
    assert set(runs["hostile"]["answers"]) - {"well-formed"}, runs["hostile"]["answers"]
    assert runs["hostile"]["hostile_jobs_refused"] == 1
    assert set(runs["baseline"]["answers"]) == {"well-formed"}
    summary = result["summary"]
    for key in ("peak_rss_mib", "peak_rss_under_limit", "victim_lag_p50_ratio",
                "victim_lag_p95_ratio"):  # fmt: skip
        assert key in summary
    assert "| victim step -> status, p95 (s) |" in proc.stdout
