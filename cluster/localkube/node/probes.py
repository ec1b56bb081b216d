"""Readiness and liveness probes: exec (inside the container's namespaces), tcpSocket,
httpGet; timing by initialDelaySeconds/periodSeconds/successThreshold/failureThreshold."""

from __future__ import annotations

import http.client
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .runtime import exec_in


def _port(probe_port: Any, container: Mapping[str, Any]) -> int:
    if isinstance(probe_port, int) or str(probe_port).isdigit():
        return int(probe_port)
    for p in container.get("ports") or []:
        if p.get("name") == probe_port:
            return int(p["containerPort"])
    raise ValueError(f"unknown named port {probe_port!r}")


def run_probe(
    probe: Mapping[str, Any],
    container: Mapping[str, Any],
    pod_ip: str,
    main_pid: int | None,
    env: dict[str, str],
) -> bool:
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "exec" in probe:
            if main_pid is None:
                return False
            res = exec_in(main_pid, list(probe["exec"]["command"]), env, timeout)
            return res.returncode == 0
        if "tcpSocket" in probe:
            t = probe["tcpSocket"]
            with socket.create_connection(
                (t.get("host") or pod_ip, _port(t["port"], container)), timeout=timeout
            ):
                return True
        if "httpGet" in probe:
            h = probe["httpGet"]
            cls = (
                http.client.HTTPSConnection
                if h.get("scheme") == "HTTPS"
                else http.client.HTTPConnection
            )
            conn = cls(h.get("host") or pod_ip, _port(h["port"], container), timeout=timeout)
            headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or []}
            conn.request("GET", h.get("path", "/"), headers=headers)
            code = conn.getresponse().status
            conn.close()
            return 200 <= code < 400
    except (OSError, subprocess.TimeoutExpired, ValueError, http.client.HTTPException):
        return False
    return False


@dataclass
class ProbeTracker:
    """Pure timing/threshold state of one probe of one container run."""

    probe: Mapping[str, Any]
    started: float
    healthy: bool | None = None  # None until the first verdict
    successes: int = 0
    failures: int = 0
    last_run: float = 0.0

    def due(self, now: float) -> bool:
        if now < self.started + float(self.probe.get("initialDelaySeconds", 0)):
            return False
        return now >= self.last_run + float(self.probe.get("periodSeconds", 10))

    def record(self, ok: bool, now: float) -> None:
        self.last_run = now
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.probe.get("successThreshold", 1)):
                self.healthy = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= int(self.probe.get("failureThreshold", 3)):
                self.healthy = False
