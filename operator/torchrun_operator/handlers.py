"""kopf wiring only: login, start/stop of the controller, and the liveness probe.

No decisions here, and no resource handlers at all: the controller watches the jobs itself
(kube/jobwatch.py; kopf's per-event machinery was most of the operator's CPU with many jobs).
kopf's on.create/on.update/daemon handlers would also add finalizers or annotations to every
job, and a finalizer means a job cannot be deleted while the operator is down.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from typing import Any

import kopf

from torchrun_operator import metrics
from torchrun_operator.controller import Controller
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube import ratelimit
from torchrun_operator.kube.leader import Gate, LeaderElector

log = logging.getLogger(__name__)


class Options:
    """Set by main() before kopf starts; read by the startup handler."""

    namespaces: list[str] | None = None
    leader_namespace: str | None = None
    leader_id: str = "torchrun-operator"
    workers: int = 16
    network_policy: bool = True  # the jobs' default; spec.networkPolicy.enabled overrides
    metrics_port: int | None = None
    kueue: bool = False  # --kueue: queue-name labelled jobs wait for Kueue's admission
    kube_api_qps: float = ratelimit.DEFAULT_QPS
    kube_api_burst: int = ratelimit.DEFAULT_BURST


_state: dict[str, Any] = {}


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # Explicit, so kopf never guesses between installed clients.
    info = kopf.login_with_service_account(**kwargs)
    server = kclient.in_cluster_server(os.environ)
    if info is not None and server:
        # The address the pod was given, as the kubernetes client (our own calls) uses it.
        return dataclasses.replace(info, server=server)
    return info or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # our own events say what matters
    # kopf's own requests (the job watch) get the bounds ours have (kube/client.py), not
    # aiohttp's 5-minute total and no connect timeout at all.
    settings.watching.server_timeout = kclient.WATCH_TIMEOUT_SECONDS
    settings.watching.client_timeout = kclient.WATCH_TIMEOUT_SECONDS + kclient.WATCH_GRACE_SECONDS
    settings.watching.connect_timeout = kclient.CONNECT_TIMEOUT_SECONDS
    settings.networking.connect_timeout = kclient.CONNECT_TIMEOUT_SECONDS
    settings.networking.request_timeout = kclient.APISERVER_REQUEST_TIMEOUT_SECONDS
    # Every write of the operator passes the gate right before it is sent: open while this
    # replica's term lasts (the elector opens and closes it), for ever without an election.
    gate = Gate()
    limiter = ratelimit.TokenBucket(
        Options.kube_api_qps, Options.kube_api_burst, observe=metrics.observe_rate_limit_wait
    )
    api = kclient.load(gate=gate, limiter=limiter)
    ctrl = Controller(
        api,
        gate=gate,
        namespaces=Options.namespaces,
        workers=Options.workers,
        network_policy=Options.network_policy,
        kueue=Options.kueue,
    )
    _state["controller"] = ctrl
    if Options.metrics_port:
        metrics.start_metrics_server(Options.metrics_port)
    ctrl.start()
    if Options.leader_namespace:
        identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        elector = LeaderElector(
            api.ungated(),  # the Lease's writes are how a term is won: they pass no gate
            Options.leader_namespace,
            Options.leader_id,
            identity,
            on_started=lambda: ctrl.set_active(True),
            on_stopped=lambda: ctrl.set_active(False),
            gate=gate,
        )
        _state["elector"] = elector
        elector.start()
    else:
        gate.open()
        ctrl.set_active(True)


@kopf.on.cleanup()
def cleanup(**_: Any) -> None:
    # The workers stop first, then the Lease is released: a released Lease lets a standby
    # start at once, and it must not overlap with our workers still writing.
    if ctrl := _state.pop("controller", None):
        ctrl.stop()
    if elector := _state.pop("elector", None):
        elector.stop()


@kopf.on.probe(id="threads")
def threads_alive(**_: Any) -> str:
    """Liveness: fails while any worker or pod-watch thread of the controller, or a leader
    election thread, is dead, so the kubelet restarts a replica that would otherwise sit
    there, alive and doing nothing.

    How kopf reports it (kopf 1.45, engines/probing.py): /healthz runs every probe handler
    and answers 200 with their results as JSON ({"threads": "ok"}); when one fails, kopf logs
    "Activity 'threads' failed permanently: dead threads: ..." and the request handler raises,
    so aiohttp answers 500 Internal Server Error, which the kubelet counts as a failed probe
    (tests/unit/kube/test_handlers.py checks this). Only successes are cached (10 s), so a
    death shows within 10 s. The error must be PermanentError: kopf retries any other
    exception after settings.execution.default_backoff (60 s) while the probe request waits,
    and the kubelet would see a timeout instead.
    """
    ctrl: Controller | None = _state.get("controller")
    elector: LeaderElector | None = _state.get("elector")
    dead = [
        *(ctrl.dead_threads() if ctrl is not None else []),
        *(elector.dead_threads() if elector is not None else []),
    ]
    if dead:
        raise kopf.PermanentError(f"dead threads: {', '.join(sorted(dead))}")
    return "ok"
