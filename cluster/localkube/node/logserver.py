"""The process node's kubelet API, as far as logs go: `kubectl logs` works on the local cluster.

The apiserver serves `pods/log` by asking the pod's node at its InternalIP and the port in
`status.daemonEndpoints.kubeletEndpoint`, with its kubelet client certificate
(`--kubelet-client-certificate`, signed by the cluster's CA), for
`GET /containerLogs/<namespace>/<pod>/<container>?follow=&previous=&tailLines=&limitBytes=`,
and streams the answer back to the client. This server answers that one path from the log
files the pod workers write (localkube.node.pods), for every node of the process.

Only clients with a certificate of the cluster's CA are served: the address is the bridge's,
which every pod reaches, and a pod must not read another's logs through it. What a real
kubelet does beyond this (timestamps, sinceSeconds, exec, port-forward) is not served: the
log files carry no per-line times. Standard library only, like the rest of the node.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger(__name__)

LOG_PATH = re.compile(r"^/containerLogs/([^/]+)/([^/]+)/([^/]+)/?$")
CHUNK = 64 * 1024
# How often a follower looks for new lines: a kubelet follows the file with inotify; a fifth
# of a second is as prompt as a reader of `kubectl logs -f` can tell.
FOLLOW_POLL_SECONDS = 0.2
# A client that sends nothing (or stops reading) is dropped after this long: the address is
# reachable from every pod, and each connection holds a thread.
IDLE_SECONDS = 30.0


@dataclass(frozen=True)
class LogQuery:
    namespace: str
    pod: str
    container: str
    follow: bool = False
    previous: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None


def parse_query(target: str) -> LogQuery | None:
    """The request target of a log request; None for any other path. ValueError for a bad
    parameter (the apiserver validates them first, so only a client of our own sends one)."""
    url = urlsplit(target)
    m = LOG_PATH.match(url.path)
    if m is None:
        return None
    params = {k: v[-1] for k, v in parse_qs(url.query).items()}

    def flag(name: str) -> bool:
        return params.get(name, "false").lower() in ("true", "1")

    def count(name: str) -> int | None:
        raw = params.get(name)
        if raw is None:
            return None
        value = int(raw)
        if value < 0:
            raise ValueError(f"{name} must not be negative")
        return value

    ns, pod, container = (unquote(g) for g in m.groups())
    follow, previous = flag("follow"), flag("previous")
    return LogQuery(ns, pod, container, follow, previous, count("tailLines"), count("limitBytes"))


def tail_offset(f: BinaryIO, lines: int) -> int:
    """Where the last `lines` lines of the file start (a last line without its newline counts
    as a line, as the kubelet counts it), read backwards in chunks."""
    end = f.seek(0, os.SEEK_END)
    if lines == 0 or end == 0:
        return end
    # Newlines counted from the end: a final newline ends the last line, it starts none.
    f.seek(end - 1)
    pos = end - 1 if f.read(1) == b"\n" else end
    seen = 0
    while pos > 0:
        start = max(0, pos - CHUNK)
        f.seek(start)
        block = f.read(pos - start)
        i = len(block)
        while (i := block.rfind(b"\n", 0, i)) >= 0:
            seen += 1
            if seen == lines:
                return start + i + 1
        pos = start
    return 0


class Sink(Protocol):
    def write(self, data: bytes, /) -> object: ...
    def flush(self) -> object: ...


def copy_log(
    f: BinaryIO,
    out: Sink,
    query: LogQuery,
    running: Callable[[], bool],
    stop: threading.Event,
) -> int:
    """Writes the log from where `f` stands to `out`, at most limitBytes; with follow, goes on
    writing what is appended until the container stops running (then what it wrote last) or
    `stop` is set. Returns the bytes written."""
    left = query.limit_bytes if query.limit_bytes is not None else float("inf")
    sent = 0
    while left > 0:
        # Asked before the read: whatever the container wrote before it ended is read after.
        ended = not query.follow or not running()
        data = f.read(int(min(CHUNK, left)))
        if data:
            out.write(data)
            out.flush()
            sent += len(data)
            left -= len(data)
            continue
        if ended or stop.wait(FOLLOW_POLL_SECONDS):
            break
    return sent


def previous_log(pod_dir: Path, container: str) -> Path | None:
    """The log of the container's run before the latest: the pod worker keeps each earlier run
    as <container>.<run>.log."""
    runs = []
    for p in pod_dir.glob(f"{glob.escape(container)}.*.log"):
        n = p.name[len(container) + 1 : -len(".log")]
        if n.isdigit():
            runs.append((int(n), p))
    return max(runs)[1] if runs else None


class LogSource(Protocol):
    def find_log(self, query: LogQuery) -> tuple[Path, Callable[[], bool]] | str:
        """The log file the query asks for and whether its container still runs (for follow);
        or why there is none (404)."""


class _Handler(BaseHTTPRequestHandler):
    server: LogServer
    timeout = IDLE_SECONDS

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        try:
            query = parse_query(self.path)
        except ValueError as e:
            self.send_error(400, str(e))
            return
        if query is None:
            self.send_error(404, "the localkube process node serves /containerLogs/ only")
            return
        found = self.server.source.find_log(query)
        if isinstance(found, str):
            self.send_error(404, found)
            return
        path, running = found
        try:
            f = open(path, "rb")  # noqa: SIM115 (closed below, after the headers)
        except OSError as e:
            self.send_error(404, f"log of {query.pod}/{query.container}: {e.strerror}")
            return
        with f:
            if query.tail_lines is not None:
                f.seek(tail_offset(f, query.tail_lines))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            # OSError: the client went away or stopped reading (the socket's timeout).
            with contextlib.suppress(OSError):
                copy_log(f, self.wfile, query, running, self.server.stopping)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("logs %s: " + format, self.client_address[0], *args)


class LogServer(ThreadingHTTPServer):
    """HTTPS on (host, port 0: the kernel's pick, in `port`); mutual TLS with the cluster's
    CA. `serve()` in a daemon thread; `close()` ends followers and the listener."""

    daemon_threads = True

    def __init__(self, host: str, cert: str, key: str, ca: str, source: LogSource) -> None:
        super().__init__((host, 0), _Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
        # The handshake in the request's thread, not in the accepting one: a client that
        # connects and says nothing must not stop the others.
        self.socket = ctx.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.source = source
        self.stopping = threading.Event()
        self.port: int = self.server_address[1]
        self.thread = threading.Thread(target=self.serve_forever, name="logs", daemon=True)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(IDLE_SECONDS)
            request.do_handshake()
        except OSError as e:  # ssl.SSLError too
            log.debug("logs: handshake with %s failed: %s", client_address, e)
            self.shutdown_request(request)
            return
        super().process_request_thread(request, client_address)

    def serve(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()
