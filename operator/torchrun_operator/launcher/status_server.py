"""What the launcher knows now (LIVE) and the read-only GET /status endpoint that
serves it to the operator (docs/pod-contract.md).
"""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading
import time
from typing import Any

from .contract import (
    ENV_STATUS_PORT,
    LIVE_STALLED,
    LIVE_STARTING,
    LIVE_TRAINING,
    LIVE_VERSION,
    STATUS_PATH,
    STATUS_PORT,
)
from .logline import log
from .progress_file import ProgressMeter
from .state import compact_json


class LiveState:
    """What this launcher knows now, for GET /status. Written by the agent's thread (the
    rendezvous), the progress thread and the stall handling; read by the server's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fields: dict[str, Any] = {"v": LIVE_VERSION, "state": LIVE_STARTING}
        self.meter: ProgressMeter | None = None
        self.stall: dict[str, Any] | None = None

    def update(self, **fields: Any) -> None:
        with self._lock:
            self.fields.update(fields)

    def get(self, key: str) -> Any:
        with self._lock:
            return self.fields.get(key)

    def observe_progress(self, now: float, text: str | None, window: float) -> None:
        with self._lock:
            if self.meter is None:
                self.meter = ProgressMeter(window)
            self.meter.observe(now, text)

    def checkpoint(self) -> dict[str, Any] | None:
        """The latest checkpoint the script reported, {step, path, at}."""
        with self._lock:
            found = self.meter.checkpoint if self.meter else None
            return dict(found) if found else None

    def set_stall(self, stall: dict[str, Any] | None) -> None:
        with self._lock:
            self.stall = stall
            if self.fields.get("state") in (LIVE_TRAINING, LIVE_STALLED):
                self.fields["state"] = LIVE_STALLED if stall else LIVE_TRAINING

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        with self._lock:
            out = dict(self.fields)
            progress = self.meter.snapshot(now) if self.meter else None
            if progress:
                out["progress"] = progress
            if self.stall:
                out["stall"] = self.stall
        out["time"] = round(now, 3)
        return out


LIVE = LiveState()


class _StatusHandler(http.server.BaseHTTPRequestHandler):
    server_version = "torchrun-operator-launcher"
    timeout = 5  # a slow or silent client does not keep a thread

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] != STATUS_PATH:
            self.send_error(404)
            return
        body = compact_json(LIVE.snapshot()).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per read every few seconds would drown the training log


class _StatusServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 16

    def handle_error(self, request: Any, client_address: Any) -> None:
        """socketserver prints a traceback into the training log for every failed request;
        a reader that gave up (the operator's read has a 1 s budget) is no error at all, and
        anything else is one line."""
        err = sys.exc_info()[1]
        if isinstance(err, OSError):  # broken pipe, reset, timed out: the client is gone
            return
        log("status request failed", error=f"{type(err).__name__}: {err}"[:300])


def _ipv6_server(port: int) -> _StatusServer:
    class Dual(_StatusServer):
        address_family = socket.AF_INET6

        def server_bind(self) -> None:
            # Both families on one socket: pods may have an IPv4 or an IPv6 address.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            super().server_bind()

    return Dual(("::", port), _StatusHandler)


def start_status_server(port: int | None = None) -> _StatusServer | None:
    """Serve LIVE read-only on every address of the pod, in daemon threads. A port that is
    taken (a hostNetwork pod next to another) is logged and skipped: the operator then only
    learns what the pod's status says."""
    if port is None:
        raw = os.environ.get(ENV_STATUS_PORT, "")
        try:
            port = int(raw) if raw else STATUS_PORT
        except ValueError:
            log("ignoring invalid status port", value=raw)
            port = STATUS_PORT
    if port <= 0:
        return None
    server: _StatusServer | None = None
    errors = []
    for make in (_ipv6_server, lambda p: _StatusServer(("0.0.0.0", p), _StatusHandler)):
        try:
            server = make(port)
            break
        except OSError as e:
            errors.append(str(e))
    if server is None:
        log("cannot serve status", port=port, error="; ".join(errors))
        return None
    threading.Thread(target=server.serve_forever, daemon=True, name="status-server").start()
    return server
