"""Prometheus metrics of the operator.

Everything lives in one registry of our own rather than prometheus-client's global default:
tests can build a fresh `Metrics` without "Duplicated timeseries" errors, and `/metrics`
shows only what we define (plus process metrics, which are useful for a long-running
operator and which we add explicitly).

The module-level functions act on a default instance so handlers need no plumbing; code that
wants isolation (tests) creates its own `Metrics`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from torchrun_operator.api import timefmt
from torchrun_operator.api.status_names import ConditionType, Phase, RestartKind
from torchrun_operator.reconcile import conditions
from torchrun_operator.reconcile.plan import PhaseChanged, Reached, Restarted, Transition

__all__ = [
    "PHASES",
    "RESTART_KINDS",
    "Metrics",
    "count_api_call",
    "count_restart",
    "default",
    "phase_counts",
    "observe_reconcile",
    "observe_time_to_rendezvous",
    "observe_time_to_running",
    "observe_write",
    "progress_samples",
    "record_transitions",
    "set_jobs_by_phase",
    "set_status_source",
    "start_metrics_server",
]

NAMESPACE = "torchrun_operator"

# Every phase a job's status can have (docs/design.md): the gauge reports 0 for phases with no
# job, so a dashboard does not show a stale value after the last job of a phase goes away.
PHASES = tuple(Phase)
# The restarts counter's label: who caused it. An elastic replacement is the infrastructure's.
RESTART_KINDS = (RestartKind.USER, RestartKind.INFRASTRUCTURE)

# Pod scheduling plus image pull can take minutes on a cold GPU node; rendezvous waits on the
# slowest pod. Buckets span a second to an hour.
_STARTUP_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
# A reconcile is a handful of API calls: milliseconds to a few seconds.
_RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# A write takes milliseconds on a healthy control plane and up to the apiserver's own 60 s on
# a slow one (our deadline: kube/leader.write_deadline): the buckets span both.
_WRITE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 45, 60)
# The writes' verbs (lower-case HTTP methods) and how a slow one ended, for the slow-writes
# counter: our deadline ran out, or the apiserver said it was too busy or gave up.
WRITE_VERBS = ("post", "put", "patch", "delete")
SLOW_OUTCOMES = ("timeout", "429", "503", "504")
# Most requests wait 0 (the burst); a create burst over it waits up to seconds.
_RATE_LIMIT_BUCKETS = (0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The operator's metrics, registered in `registry` (a fresh one unless given)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.jobs = Gauge(
            "jobs",
            "DistributedTrainingJobs by phase.",
            ["phase"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.restarts = Counter(
            "restarts",
            "Gang restarts, by cause: user (the training code failed) or "
            "infrastructure (a pod or node was lost).",
            ["kind"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.phase_transitions = Counter(
            "phase_transitions",
            "Phase changes the operator decided, by the phase left and the phase entered.",
            ["from_phase", "to_phase"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.time_to_running = Histogram(
            "time_to_running_seconds",
            "From job creation to all pods running.",
            namespace=NAMESPACE,
            registry=r,
            buckets=_STARTUP_BUCKETS,
        )
        self.time_to_rendezvous = Histogram(
            "time_to_rendezvous_seconds",
            "From job creation (or gang restart) to rendezvous complete on every pod.",
            namespace=NAMESPACE,
            registry=r,
            buckets=_STARTUP_BUCKETS,
        )
        self.reconcile_duration = Histogram(
            "reconcile_duration_seconds",
            "Duration of one reconciliation of one job.",
            namespace=NAMESPACE,
            registry=r,
            buckets=_RECONCILE_BUCKETS,
        )
        self.reconcile_errors = Counter(
            "reconcile_errors",
            "Reconciliations that raised.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.api_requests = Counter(
            "api_requests",
            "Kubernetes API requests made by the operator.",
            ["verb", "resource", "code"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.rate_limit_wait = Histogram(
            "client_rate_limit_wait_seconds",
            "Time each API request waited for the client-side rate limit (--kube-api-qps, "
            "--kube-api-burst) before it was sent.",
            namespace=NAMESPACE,
            registry=r,
            buckets=_RATE_LIMIT_BUCKETS,
        )
        self.write_duration = Histogram(
            "api_write_duration_seconds",
            "Time from sending each write (POST, PUT, PATCH, DELETE) of the operator to its "
            "answer, or to giving up on it, by verb.",
            ["verb"],
            namespace=NAMESPACE,
            registry=r,
            buckets=_WRITE_BUCKETS,
        )
        self.slow_writes = Counter(
            "api_slow_writes",
            "Writes of the operator that timed out, or that the apiserver answered 429, 503 "
            "or 504 (too busy, or it gave up on them), by verb and outcome.",
            ["verb", "outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.progress = ProgressCollector()
        r.register(self.progress)
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(0)
        for kind in RESTART_KINDS:
            # Pre-create so `rate()` sees a 0 before the first restart, not an absent series.
            self.restarts.labels(kind=kind)
        for verb in WRITE_VERBS:
            self.write_duration.labels(verb=verb)
            for outcome in SLOW_OUTCOMES:
                self.slow_writes.labels(verb=verb, outcome=outcome)

    def observe_write(self, verb: str, seconds: float, outcome: str | None = None) -> None:
        """One write sent: how long until it was answered or given up on, and how it ended
        when slow (SLOW_OUTCOMES; None for any other end)."""
        self.write_duration.labels(verb=verb).observe(seconds)
        if outcome is not None:
            self.slow_writes.labels(verb=verb, outcome=outcome).inc()

    def observe_rate_limit_wait(self, seconds: float) -> None:
        self.rate_limit_wait.observe(seconds)

    def observe_reconcile(self, seconds: float, error: bool = False) -> None:
        self.reconcile_duration.observe(seconds)
        if error:
            self.reconcile_errors.inc()

    def count_api_call(self, verb: str, resource: str, code: int | str) -> None:
        self.api_requests.labels(verb=verb, resource=resource, code=str(code)).inc()

    def set_jobs_by_phase(self, counts: Mapping[str, int]) -> None:
        """Set the gauge to `counts`; phases absent from `counts` drop to 0."""
        for phase in set(PHASES) | set(counts):
            self.jobs.labels(phase=phase).set(counts.get(phase, 0))

    def count_restart(self, kind: str) -> None:
        if kind not in RESTART_KINDS:
            raise ValueError(f"restart kind must be one of {RESTART_KINDS}, got {kind!r}")
        self.restarts.labels(kind=kind).inc()

    def observe_time_to_running(self, seconds: float) -> None:
        self.time_to_running.observe(seconds)

    def observe_time_to_rendezvous(self, seconds: float) -> None:
        self.time_to_rendezvous.observe(seconds)

    def record_transitions(self, transitions: Iterable[Transition]) -> None:
        """Count what one reconciliation decided (reconcile.Plan.transitions); the caller
        records a plan once, after its status was written."""
        for t in transitions:
            if isinstance(t, PhaseChanged):
                self.phase_transitions.labels(from_phase=t.before, to_phase=t.after).inc()
            elif isinstance(t, Restarted):
                user = t.kind == RestartKind.USER
                self.count_restart(RestartKind.USER if user else RestartKind.INFRASTRUCTURE)
            elif isinstance(t, Reached) and t.seconds is not None:
                if t.condition == ConditionType.RUNNING:
                    self.observe_time_to_running(t.seconds)
                else:
                    self.observe_time_to_rendezvous(t.seconds)


# ---- live progress, from the jobs' statuses at scrape time -------------------------------

# name -> help; every name gets the torchrun_operator_ prefix.
RANK_METRICS = {
    "rank_step": "Last training step a pod's script reported (status.ranks[].step).",
    "rank_steps_per_second": "A pod's steps per second over its launcher's window.",
    "rank_step_seconds": "A pod's mean seconds per step over its launcher's window.",
    "rank_last_step_timestamp_seconds": "When a pod's step last changed (unix seconds).",
    "rank_seconds_since_step": "Seconds since a pod's step last changed, at scrape time.",
}
JOB_METRICS = {
    "job_step": "The lowest last step of a job's pods (status.progress.step).",
    "job_total_steps": "The step count the job's script declared.",
    "job_steps_per_second": "The median of a job's pods' steps per second.",
    "job_eta_timestamp_seconds": "When the job reaches its declared steps at that rate.",
    "job_straggler": "1 while the job's Straggler condition is True, else 0 (opted-in jobs).",
}
RANK_LABELS = ("namespace", "job", "index", "node_rank", "pod")
JOB_LABELS = ("namespace", "job")
_RUNNING = (Phase.STARTING, Phase.RUNNING)


def _num(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _conditions(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(c) for c in status.get("conditions") or [] if isinstance(c, Mapping)]


def progress_samples(
    jobs: Iterable[Mapping[str, Any]], now: float
) -> list[tuple[str, tuple[str, ...], float]]:
    """(metric, label values, value) for the progress metrics of the jobs that run: the
    per-pod figures of status.ranks, the job's status.progress and its Straggler
    condition. Finished jobs have none (their series go away)."""
    out: list[tuple[str, tuple[str, ...], float]] = []
    for job in jobs:
        meta, status = job.get("metadata") or {}, job.get("status") or {}
        if status.get("phase") not in _RUNNING:
            continue
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        for r in status.get("ranks") or []:
            if not isinstance(r, Mapping) or r.get("step") is None or "index" not in r:
                continue
            node_rank = r.get("nodeRank")
            labels = (
                *key,
                str(r["index"]),
                "" if node_rank is None else str(node_rank),
                str(r.get("pod", "")),
            )
            last = timefmt.seconds(r.get("lastStepAt"))
            for name, value in (
                ("rank_step", _num(r.get("step"))),
                ("rank_steps_per_second", _num(r.get("stepsPerSecond"))),
                ("rank_step_seconds", _num(r.get("stepSeconds"))),
                ("rank_last_step_timestamp_seconds", last),
                ("rank_seconds_since_step", None if last is None else max(0.0, now - last)),
            ):
                if value is not None:
                    out.append((name, labels, value))
        progress = status.get("progress") or {}
        for name, value in (
            ("job_step", _num(progress.get("step"))),
            ("job_total_steps", _num(progress.get("totalSteps"))),
            ("job_steps_per_second", _num(progress.get("stepsPerSecond"))),
            ("job_eta_timestamp_seconds", timefmt.seconds(progress.get("eta"))),
        ):
            if value is not None:
                out.append((name, key, value))
        straggler = conditions.get(_conditions(status), ConditionType.STRAGGLER)
        if straggler is not None:
            out.append(("job_straggler", key, 1.0 if straggler.get("status") == "True" else 0.0))
    return out


class ProgressCollector(Collector):
    """Yields the progress metrics from the job statuses a source gives, at scrape time: no
    series outlives its job, and nothing is computed between scrapes."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[Mapping[str, Any]]] = list

    def describe(self) -> Iterator[Metric]:
        return iter(self._families().values())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        for name, labels, value in progress_samples(self.source(), time.time()):
            families[name].add_metric(list(labels), value)
        return iter(families.values())

    def _families(self) -> dict[str, GaugeMetricFamily]:
        out = {}
        for table, labels in ((RANK_METRICS, RANK_LABELS), (JOB_METRICS, JOB_LABELS)):
            for name, text in table.items():
                out[name] = GaugeMetricFamily(f"{NAMESPACE}_{name}", text, labels=list(labels))
        return out


def phase_counts(statuses: Iterable[Mapping[str, Any] | None]) -> dict[str, int]:
    """Jobs per phase; a job with no status yet counts as Pending."""
    counts: dict[str, int] = {}
    for st in statuses:
        phase = str((st or {}).get("phase") or Phase.PENDING)
        counts[phase] = counts.get(phase, 0) + 1
    return counts


default = Metrics()
ProcessCollector(registry=default.registry)

_server_lock = threading.Lock()


def observe_rate_limit_wait(seconds: float) -> None:
    default.observe_rate_limit_wait(seconds)


def observe_reconcile(seconds: float, error: bool = False) -> None:
    default.observe_reconcile(seconds, error)


def count_api_call(verb: str, resource: str, code: int | str) -> None:
    default.count_api_call(verb, resource, code)


def observe_write(verb: str, seconds: float, outcome: str | None = None) -> None:
    default.observe_write(verb, seconds, outcome)


def set_jobs_by_phase(counts: Mapping[str, int]) -> None:
    default.set_jobs_by_phase(counts)


def count_restart(kind: str) -> None:
    default.count_restart(kind)


def observe_time_to_running(seconds: float) -> None:
    default.observe_time_to_running(seconds)


def observe_time_to_rendezvous(seconds: float) -> None:
    default.observe_time_to_rendezvous(seconds)


def record_transitions(transitions: Iterable[Transition]) -> None:
    default.record_transitions(transitions)


def set_status_source(source: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
    """Where the progress metrics come from at scrape time: the jobs (the controller's cache)."""
    default.progress.source = source


def start_metrics_server(
    port: int, addr: str = "0.0.0.0", metrics: Metrics | None = None
) -> WSGIServer:
    """Serve `/metrics` of `metrics` (the default instance) on a daemon thread.

    Returns the server so callers (tests, shutdown) can `shutdown()` it; port 0 picks a free
    port, readable as `server.server_port`.
    """
    m = metrics if metrics is not None else default
    with _server_lock:
        server, _thread = start_http_server(port, addr=addr, registry=m.registry)
    return server
