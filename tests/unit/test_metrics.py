"""The operator's Prometheus metrics: names, labels, and what a scrape of /metrics shows."""

from __future__ import annotations

import urllib.request

import jobs
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from torchrun_operator import metrics
from torchrun_operator.metrics import Metrics


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    value = m.registry.get_sample_value(name, labels)
    return value


def test_jobs_gauge_reports_every_phase_and_zeroes_vanished_ones() -> None:
    m = Metrics()
    m.set_jobs_by_phase({"Running": 3, "Failed": 1})
    assert sample(m, "torchrun_operator_jobs", phase="Running") == 3
    assert sample(m, "torchrun_operator_jobs", phase="Failed") == 1
    assert sample(m, "torchrun_operator_jobs", phase="Pending") == 0

    m.set_jobs_by_phase({"Succeeded": 4})
    assert sample(m, "torchrun_operator_jobs", phase="Running") == 0
    assert sample(m, "torchrun_operator_jobs", phase="Failed") == 0
    assert sample(m, "torchrun_operator_jobs", phase="Succeeded") == 4


def test_restarts_counted_by_kind_and_present_before_the_first() -> None:
    m = Metrics()
    assert sample(m, "torchrun_operator_restarts_total", kind="user") == 0
    assert sample(m, "torchrun_operator_restarts_total", kind="infrastructure") == 0
    m.count_restart("user")
    m.count_restart("user")
    m.count_restart("infrastructure")
    assert sample(m, "torchrun_operator_restarts_total", kind="user") == 2
    assert sample(m, "torchrun_operator_restarts_total", kind="infrastructure") == 1


def test_unknown_restart_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="user"):
        Metrics().count_restart("oom")


def test_reconcile_duration_and_errors() -> None:
    m = Metrics()
    m.observe_reconcile(0.02)
    m.observe_reconcile(3.0, error=True)
    assert sample(m, "torchrun_operator_reconcile_duration_seconds_count") == 2
    assert sample(m, "torchrun_operator_reconcile_duration_seconds_sum") == pytest.approx(3.02)
    assert sample(m, "torchrun_operator_reconcile_duration_seconds_bucket", le="0.025") == 1
    assert sample(m, "torchrun_operator_reconcile_errors_total") == 1


def test_api_requests_by_verb_resource_code() -> None:
    m = Metrics()
    m.count_api_call("create", "pods", 201)
    m.count_api_call("create", "pods", 201)
    m.count_api_call("create", "pods", "409")
    labels = {"verb": "create", "resource": "pods"}
    assert sample(m, "torchrun_operator_api_requests_total", **labels, code="201") == 2
    assert sample(m, "torchrun_operator_api_requests_total", **labels, code="409") == 1


def test_startup_histograms() -> None:
    m = Metrics()
    m.observe_time_to_running(42)
    m.observe_time_to_rendezvous(90)
    assert sample(m, "torchrun_operator_time_to_running_seconds_bucket", le="60.0") == 1
    assert sample(m, "torchrun_operator_time_to_running_seconds_bucket", le="30.0") == 0
    assert sample(m, "torchrun_operator_time_to_rendezvous_seconds_sum") == 90


def test_instances_are_isolated_from_each_other_and_the_global_registry() -> None:
    a, b = Metrics(), Metrics()
    a.count_restart("user")
    assert sample(b, "torchrun_operator_restarts_total", kind="user") == 0
    assert REGISTRY.get_sample_value("torchrun_operator_restarts_total", {"kind": "user"}) is None


def test_module_functions_feed_the_default_instance() -> None:
    before = (
        sample(
            metrics.default,
            "torchrun_operator_api_requests_total",
            verb="patch",
            resource="distributedtrainingjobs",
            code="200",
        )
        or 0
    )
    metrics.count_api_call("patch", "distributedtrainingjobs", 200)
    after = sample(
        metrics.default,
        "torchrun_operator_api_requests_total",
        verb="patch",
        resource="distributedtrainingjobs",
        code="200",
    )
    assert after == before + 1


def test_metrics_server_serves_the_registry_over_http() -> None:
    m = Metrics()
    m.set_jobs_by_phase({"Running": 7})
    server = metrics.start_metrics_server(0, addr="127.0.0.1", metrics=m)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200
            body = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    running = [
        s for s in families["torchrun_operator_jobs"].samples if s.labels == {"phase": "Running"}
    ]
    assert running[0].value == 7


# ---- live progress, at scrape time from the jobs' statuses ---------------------------------


def progress_job(phase: str = "Running") -> dict:
    return jobs.document(
        "bert",
        namespace="ml",
        status={
            "phase": phase,
            "ranks": [
                {
                    "index": 0,
                    "pod": "bert-0",
                    "nodeRank": 1,
                    "step": 120,
                    "stepsPerSecond": 2.5,
                    "stepSeconds": 0.4,
                    "lastStepAt": "2026-11-26T12:00:00Z",
                },
                {"index": 1, "pod": "bert-1", "phase": "Pending"},  # no step: no series
                {"nodeRank": 0, "pod": "old-format", "step": 3},  # no index: skipped
            ],
            "progress": {"step": 118, "totalSteps": 1000, "stepsPerSecond": 2.5},
            "conditions": [{"type": "Straggler", "status": "True"}],
        },
    )


def test_progress_samples_per_pod_and_per_job() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 11, 26, 12, 0, 7, tzinfo=UTC).timestamp()
    samples = {(n, labels): v for n, labels, v in metrics.progress_samples([progress_job()], now)}
    pod = ("ml", "bert", "0", "1", "bert-0")
    assert samples[("rank_step", pod)] == 120
    assert samples[("rank_steps_per_second", pod)] == 2.5
    assert samples[("rank_step_seconds", pod)] == 0.4
    assert samples[("rank_seconds_since_step", pod)] == 7
    assert samples[("job_step", ("ml", "bert"))] == 118
    assert samples[("job_total_steps", ("ml", "bert"))] == 1000
    assert samples[("job_straggler", ("ml", "bert"))] == 1
    assert not [k for k in samples if k[1][-1:] in (("bert-1",), ("old-format",))]
    assert metrics.progress_samples([progress_job("Succeeded")], now) == []


def test_progress_metrics_are_scraped_from_the_source() -> None:
    m = Metrics()
    m.progress.source = lambda: [progress_job()]
    value = sample(
        m,
        "torchrun_operator_rank_step",
        namespace="ml",
        job="bert",
        index="0",
        node_rank="1",
        pod="bert-0",
    )
    assert value == 120
    assert sample(m, "torchrun_operator_job_straggler", namespace="ml", job="bert") == 1
    m.progress.source = list
    assert sample(m, "torchrun_operator_job_step", namespace="ml", job="bert") is None


def test_docs_metrics_md_lists_every_metric_the_operator_serves() -> None:
    """Each of our metrics (counters with their `_total`) has its row in docs/metrics.md."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    m = Metrics()
    names = []
    for family in m.registry.collect():
        names.append(f"{family.name}_total" if family.type == "counter" else family.name)
    assert len(names) > 10
    assert [n for n in names if f"| `{n}` |" not in doc] == []
