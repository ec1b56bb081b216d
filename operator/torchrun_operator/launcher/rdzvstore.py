"""The rendezvous host: its name resolved, and its store reached where it really is.

Before torchrun starts, every pod but the store's host waits (bounded) until the rendezvous
host's name resolves: pod 0's address is published only once it has one (the headless Service
publishes not-ready addresses), and a pod that starts first would otherwise fail at once.

Each attempt has its own hostnames (``<job>-0``, then ``<job>-0-a1``, ...), so no record of an
earlier attempt can answer the name. Even so a name can resolve to an address no store
listens on yet, or any more: a cluster DNS that lags (an EndpointSlice not yet updated, a
cached answer), a pod of the attempt replaced within it. torch's store client connects to
whatever the name gives, retries for its 60 s connect timeout, and the pod fails with a
communication error: a gang restart, or a failed job when the budget is spent. So:

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
# How often a wait that goes on says so.
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


def conf_hosts_store(conf: str | None) -> bool:
    """`hosts_store` for an unparsed ``--rdzv-conf`` value (``k=v,k=v``), before torch is
    imported."""
    pairs = (item.split("=", 1) for item in (conf or "").split(",") if "=" in item)
    return hosts_store({k.strip(): v for k, v in pairs})


def loopback_endpoint(endpoint: str) -> str:
    """The store host's own endpoint: the same port on ``localhost`` (torch's store servers
    listen on every address, and take ``localhost`` as this machine)."""
    _, port = split_endpoint(endpoint)
    return f"localhost:{port}"


class _Waiting:
    """A bounded wait's clock, and its log line every `every` seconds while it goes on."""

    def __init__(self, what: str, timeout: float, every: float = LOG_INTERVAL) -> None:
        self.what, self.timeout, self.every = what, timeout, every
        self.start = self.last = time.monotonic()

    def waited(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return max(0.0, self.timeout - self.waited())

    def says(self, **fields: Any) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            log(
                self.what, waited=f"{now - self.start:.0f}s", timeout=f"{self.timeout:g}s", **fields
            )
            self.last = now


def wait_for_dns(
    host: str,
    timeout: float,
    resolve: Callable[[str], Any] | None = None,
    interval: float = 0.5,
    log_every: float = LOG_INTERVAL,
) -> bool:
    """Wait until ``host`` resolves or ``timeout`` seconds pass. Returns whether it resolved.
    Each lookup is given only the time left, so a resolver that hangs cannot stretch the
    bound."""
    lookup = resolve or (lambda h: socket.getaddrinfo(h, None))
    wait = _Waiting("waiting for rendezvous host to resolve", timeout, log_every)
    while True:
        try:
            found = _bounded(lambda: lookup(host), wait.left())
        except OSError as e:
            error = str(e)
        else:
            addrs = sorted({a[4][0] for a in found if len(a) > 4 and a[4]})
            log(
                "rendezvous host resolved",
                host=host,
                addresses=",".join(addrs) or "?",
                waited=f"{wait.waited():.1f}s",
            )
            return True
        if wait.left() <= 0:
            return False
        wait.says(host=host, last_error=error)
        time.sleep(min(interval, wait.left()))


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

    t = threading.Thread(target=run, daemon=True, name="rdzv-lookup")
    t.start()
    t.join(max(0.0, timeout))
    if "value" in out:
        return out["value"]
    raise OSError(out.get("error", "timed out"))


def _answers(host: str, port: int, resolve: Resolver, connect: Connector) -> str | None:
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
    wait = _Waiting("waiting for the rendezvous store to answer", timeout)
    error = ""
    while True:
        try:
            address = _answers(host, port, resolve, connect)
        except OSError as e:
            address, error = None, str(e)
        if address is not None:
            if wait.waited() >= 1.0:
                log(
                    "rendezvous store answers",
                    endpoint=endpoint,
                    address=address,
                    waited=f"{wait.waited():.1f}s",
                )
            return True
        if wait.left() <= 0:
            log(
                "rendezvous store did not answer; joining anyway",
                endpoint=endpoint,
                waited=f"{wait.waited():.0f}s",
                last_error=error or "refused or unreachable",
            )
            return False
        wait.says(endpoint=endpoint)
        time.sleep(min(interval, wait.left()))
