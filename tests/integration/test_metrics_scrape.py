"""The operator's /metrics, scraped over HTTP while it runs real jobs."""

from __future__ import annotations

import urllib.request

from dtj import REPO, OperatorProcess, apply, load_docs, wait_for, wait_phase
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def first_scrape(port: int) -> Samples:
    """The operator serves /metrics once started: wait for it (it may have just started)."""

    def attempt() -> Samples | None:
        try:
            return scrape(port)
        except OSError:  # URLError: not listening yet
            return None

    result: Samples = wait_for("the operator's /metrics", attempt, timeout=60)
    return result


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_a_job_shows_up_in_every_metric(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    before = first_scrape(operator.metrics_port)
    job = apply(kube, namespace, load_docs(REPO / "examples" / "cpu-ddp.yaml"))
    name = job["metadata"]["name"]
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]

    # The gauge follows the job cache, which the operator updates from its own status patch:
    # by the time the API shows Succeeded, so does /metrics (polled: scraping is not atomic
    # with the patch).
    after = wait_for(
        "the Succeeded job in torchrun_operator_jobs",
        lambda: (
            s
            if value(
                s := scrape(operator.metrics_port), "torchrun_operator_jobs", phase="Succeeded"
            )
            >= 1
            else None
        ),
        timeout=30,
    )
    phases = {
        dict(labels)["phase"] for (metric, labels) in after if metric == "torchrun_operator_jobs"
    }
    assert {"Pending", "Running", "Succeeded", "Failed"} <= phases

    def grew(metric: str, **labels: str) -> float:
        return value(after, metric, **labels) - value(before, metric, **labels)

    assert grew("torchrun_operator_reconcile_duration_seconds_count") > 0
    # Two pods, a Service and a ConfigMap created; status patched.
    assert (
        grew("torchrun_operator_api_requests_total", verb="create", resource="pod", code="201") >= 2
    )
    assert (
        grew(
            "torchrun_operator_api_requests_total",
            verb="patch",
            resource="distributedtrainingjob/status",
            code="200",
        )
        >= 1
    )
    # The job reached all-pods-running and rendezvous once each.
    assert grew("torchrun_operator_time_to_running_seconds_count") >= 1
    assert grew("torchrun_operator_time_to_rendezvous_seconds_count") >= 1
    assert value(after, "torchrun_operator_time_to_rendezvous_seconds_sum") >= value(
        before, "torchrun_operator_time_to_rendezvous_seconds_sum"
    )
    # The phases the operator took it through, each change counted as it decided it.
    started = {"from_phase": "Pending", "to_phase": "Starting"}
    assert grew("torchrun_operator_phase_transitions_total", **started) >= 1
    assert (
        sum(
            grew("torchrun_operator_phase_transitions_total", from_phase=p, to_phase="Succeeded")
            for p in ("Starting", "Running")
        )
        >= 1
    )
    # No gang restart in a job that succeeded first time; both series exist anyway.
    assert grew("torchrun_operator_restarts_total", kind="user") == 0
    assert ("torchrun_operator_restarts_total", frozenset({("kind", "infrastructure")})) in after
    assert value(after, "process_resident_memory_bytes") > 0
