"""One read of a launcher's status endpoint (`fetch`: GET /status over a plain socket, bounded
in time and size, its answer checked by reconcile/podinput.py), and the read function the
rank-map reader (kube/rankmap.py) uses by default."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from torchrun_operator.launcher import contract
from torchrun_operator.reconcile import podinput
from torchrun_operator.reconcile.podinput import LiveAnswer, Rejected

log = logging.getLogger(__name__)

# A launcher answers from memory in microseconds; a pod that does not answer within this is
# not worth waiting for (the next read comes soon).
READ_TIMEOUT_SECONDS = 1.0
# The most of an answer that is read: a launcher's answer is well under 8 KiB.
MAX_ANSWER_BYTES = podinput.MAX_ANSWER_BYTES
# Benchmarks only: send every read to this host:port instead of the pod's IP, with the pod's
# IP as the request's Host, so that one stub server (bench/progress_cost.py) can answer for
# every pod with that pod's binding (rdzvId, index).
ENV_ADDRESS_OVERRIDE = "TORCHRUN_OPERATOR_STATUS_ADDRESS"


Read = LiveAnswer | Rejected | None


def fetch(
    ip: str,
    port: int = contract.STATUS_PORT,
    timeout: float = READ_TIMEOUT_SECONDS,
    host: str = "status",
) -> Read:
    """One GET /status, HTTP/1.0 over a plain socket, everything (connect, request, answer)
    within `timeout` and MAX_ANSWER_BYTES: a pod that answers slowly, a byte at a time, or
    without end cannot hold a reader thread longer. None when the pod does not answer in
    time, or answers anything but 200; the answer checked by podinput otherwise (a
    LiveAnswer, or Rejected with why). `host` is the request's Host header (the pod's IP
    when ENV_ADDRESS_OVERRIDE sends every read to one stub)."""
    deadline = time.monotonic() + timeout
    request = f"GET {contract.STATUS_PATH} HTTP/1.0\r\nHost: {host}\r\n\r\n"
    chunks: list[bytes] = []
    size = 0
    try:
        with socket.create_connection((ip, port), timeout=timeout) as sock:
            sock.sendall(request.encode())
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER_BYTES + 4096:  # the answer, and room for its head
                    return Rejected(f"larger than {MAX_ANSWER_BYTES} bytes")
    except OSError:
        return None
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status_line) < 2 or status_line[1] != b"200":
        return None
    return podinput.parse_answer(body)


def checked(read: object) -> Read:
    """A read function's result as the reader keeps it: fetch's own, or a decoded answer
    (tests, benchmarks) checked here."""
    if read is None or isinstance(read, LiveAnswer | Rejected):
        return read
    return podinput.live_answer(read)


def default_read() -> Callable[[str, int], Read]:
    override = os.environ.get(ENV_ADDRESS_OVERRIDE)
    if override:
        host, _, port = override.rpartition(":")
        log.warning("reading every pod's status from %s (%s)", override, ENV_ADDRESS_OVERRIDE)
        return lambda ip, _: fetch(host, int(port), host=ip)
    return fetch
