"""The rendezvous store, reached where it really is.

Attempts reuse hostnames: pod 0 of every attempt is ``<job>-0``. A cluster DNS that lags (an
EndpointSlice not yet updated, a cached answer) can answer that name with the address of an
earlier attempt's pod 0, and did so for over two minutes on the local cluster after a Kueue
re-admission during apiserver restarts. torch's store client connects to whatever the name
gives, retries for its 60 s connect timeout, and the pod fails with a communication error: a
gang restart, or a failed job when the budget is spent, caused by a stale record. So:

- the pod that hosts the store (``is_host`` in the rendezvous conf) reaches its own store over
  loopback, never through the name;
- the others, before joining, wait until an address the name resolves to accepts a
  connection on the rendezvous port, resolving the name again each try. The wait is bounded;
  past it they join anyway and torch's own timeouts decide. It runs after torch is imported,
  so it costs nothing when the store is already up: the first try connects.

The probe connects and closes without sending a byte: torch's store servers drop such a
connection like any client that went away.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .logline import log

# torch's default c10d rendezvous port, when the endpoint names none.
DEFAULT_PORT = 29400
# One connection attempt: an address on the pod network answers in milliseconds; one that no
# pod holds any more is dropped silently (no RST), so a try must not wait long for it.
CONNECT_TIMEOUT = 1.0
# Between tries: the store comes up a few seconds after its pod starts.
RETRY_INTERVAL = 0.25
LOG_INTERVAL = 5.0

Resolver = Callable[[str, int], list[Any]]
Connector = Callable[[Any, float], None]


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port``, a bare host or a bare IPv6 address, as torch parses them."""
    value = endpoint.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:
        host, port = value, ""
    return host, int(port) if port.isdigit() else DEFAULT_PORT


def hosts_store(rdzv_configs: Mapping[str, Any]) -> bool:
    """Whether this node hosts the store: the operator renders ``is_host=1`` on pod 0."""
    return str(rdzv_configs.get("is_host", "")).strip().lower() in ("1", "true", "yes", "y")


def loopback_endpoint(endpoint: str) -> str:
    """The store host's own endpoint: the same port on ``localhost`` (torch's store servers
    listen on every address, and take ``localhost`` as this machine)."""
    _, port = split_endpoint(endpoint)
    return f"localhost:{port}"


def _resolve(host: str, port: int) -> list[Any]:
    return [a[4] for a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def _connect(address: Any, timeout: float) -> None:
    family = socket.AF_INET6 if len(address) == 4 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(address)


def _bounded(fn: Callable[[], Any], timeout: float) -> Any:
    """fn() in a daemon thread, given at most `timeout` seconds (a resolver can hang)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001 - any failure means "not yet"
            out["error"] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=run, daemon=True, name="rdzv-store-wait")
    t.start()
    t.join(max(0.0, timeout))
    if "value" in out:
        return out["value"]
    raise OSError(out.get("error", "timed out"))


def answers(host: str, port: int, resolve: Resolver, connect: Connector) -> str | None:
    """The first address of `host` that accepts a connection on `port`, else None."""
    for address in _bounded(lambda: resolve(host, port), CONNECT_TIMEOUT * 2):
        try:
            connect(address, CONNECT_TIMEOUT)
        except OSError:
            continue
        return str(address[0])
    return None


def wait_for_store(
    endpoint: str,
    timeout: float,
    resolve: Resolver = _resolve,
    connect: Connector = _connect,
    interval: float = RETRY_INTERVAL,
) -> bool:
    """Wait until the store at `endpoint` accepts a connection, or `timeout` seconds pass.
    Returns whether it answered."""
    host, port = split_endpoint(endpoint)
    start = time.monotonic()
    last_log, last_error = start, ""
    while True:
        try:
            address = answers(host, port, resolve, connect)
        except OSError as e:
            address, last_error = None, str(e)
        now = time.monotonic()
        if address is not None:
            if now - start >= 1.0:
                log(
                    "rendezvous store answers",
                    endpoint=endpoint,
                    address=address,
                    waited=f"{now - start:.1f}s",
                )
            return True
        if now - start >= timeout:
            log(
                "rendezvous store did not answer; joining anyway",
                endpoint=endpoint,
                waited=f"{now - start:.0f}s",
                last_error=last_error or "refused or unreachable",
            )
            return False
        if now - last_log >= LOG_INTERVAL:
            log(
                "waiting for the rendezvous store to answer",
                endpoint=endpoint,
                waited=f"{now - start:.0f}s",
                timeout=f"{timeout:g}s",
            )
            last_log = now
        time.sleep(min(interval, max(0.0, timeout - (now - start))))
