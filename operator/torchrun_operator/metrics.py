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
from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)

__all__ = [
    "PHASES",
    "RESTART_KINDS",
    "Metrics",
    "count_api_call",
    "count_restart",
    "default",
    "observe_reconcile",
    "observe_time_to_rendezvous",
    "observe_time_to_running",
    "set_jobs_by_phase",
    "start_metrics_server",
]

NAMESPACE = "torchrun_operator"

# Every phase of DESIGN "Status": the gauge reports 0 for phases with no job, so a dashboard
# does not show a stale value after the last job of a phase goes away.
PHASES = ("Pending", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
RESTART_KINDS = ("user", "infrastructure")

# Pod scheduling plus image pull can take minutes on a cold GPU node; rendezvous waits on the
# slowest pod. Buckets span a second to an hour.
_STARTUP_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
# A reconcile is a handful of API calls: milliseconds to a few seconds.
_RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


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
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(0)
        for kind in RESTART_KINDS:
            # Pre-create so `rate()` sees a 0 before the first restart, not an absent series.
            self.restarts.labels(kind=kind)

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


default = Metrics()
ProcessCollector(registry=default.registry)

_server_lock = threading.Lock()


def observe_reconcile(seconds: float, error: bool = False) -> None:
    default.observe_reconcile(seconds, error)


def count_api_call(verb: str, resource: str, code: int | str) -> None:
    default.count_api_call(verb, resource, code)


def set_jobs_by_phase(counts: Mapping[str, int]) -> None:
    default.set_jobs_by_phase(counts)


def count_restart(kind: str) -> None:
    default.count_restart(kind)


def observe_time_to_running(seconds: float) -> None:
    default.observe_time_to_running(seconds)


def observe_time_to_rendezvous(seconds: float) -> None:
    default.observe_time_to_rendezvous(seconds)


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
