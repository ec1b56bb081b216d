"""Fault injection into the operator's own API requests, for tests only.

Off unless the environment variable TORCHRUN_OPERATOR_FAULTS names a JSON file; then every
request our ApiClient sends (controller, pod watch, leader election; not kopf's own watch,
which has its own HTTP client) passes the rules in that file. Unset, the client holds no
injector and pays one `is None` test per request.

The file:

    {
      "log": "/tmp/faults.log",            optional: one JSON line per injected fault
      "rules": [
        {
          "method": "writes",              "GET", "PUT", ..., a list of them, "writes"
                                           (POST PUT PATCH DELETE) or "*" (the default)
          "path": "/pods(\\\\?|$)",           regex, re.search'ed in the URL's path and query,
                                           e.g. "/api/v1/namespaces/ns/pods?watch=true&..."
                                           (the default matches everything)
          "nth": 3,                        act on the 3rd matching request (1-based; default 1)
          "times": 1,                      ... and on this many matches from there on
                                           (default 1), or "all"
          "delay": 0.0,                    seconds to sleep before acting (default 0)
          "action": "status",              status | timeout | lose_response | late
                                           | kill_before | kill_after | pass
          "status": 500,                   for "status": the HTTP code answered
          "retry_after": 1                 for "status": a Retry-After header (seconds)
        }
      ]
    }

Every rule counts the requests that match its method and path, whether or not it acts on
them; the first rule that acts on a request decides its fate. Actions:

- status: the request is not sent; the client gets a response with that code and a
  Kubernetes Status body, so the API call raises the ApiException (subclass) it would raise
  for a real one, headers included.
- timeout: not sent; urllib3's ConnectTimeoutError is raised, as for an unreachable server.
- lose_response: sent, then the response is dropped and urllib3's ReadTimeoutError raised:
  the write happened but the caller cannot know.
- late: the client gives up at once (urllib3's ReadTimeoutError, as for lose_response) and
  the request is sent `delay` seconds later from a thread of its own: a write the apiserver
  commits after the client gave up on it, maybe after the operator has moved on (a pod of
  an attempt that has ended). Here `delay` is not slept by the caller.
- kill_before / kill_after: SIGKILL to this process right before / right after sending.
- pass: sent as it is (after the delay: a slow request), and logged once its answer came,
  so a test can tell which requests of which replica reached the apiserver, and by when.

A log line is appended as the action takes effect: before the error is raised or the SIGKILL
sent (for lose_response, kill_after and pass, after the request was sent; for late, as the
client gives up), with one write() on an
O_APPEND file, so replicas may share the log and a driver can count faults:
{"time": ..., "pid": ..., "rule": <index>, "n": <match count>, "action": ..., "method": ...,
"path": ...}.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import urllib3

ENV = "TORCHRUN_OPERATOR_FAULTS"

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ACTIONS = frozenset(
    {"status", "timeout", "lose_response", "late", "kill_before", "kill_after", "pass"}
)
_RULE_KEYS = frozenset(
    {"method", "path", "nth", "times", "delay", "action", "status", "retry_after"}
)

# Send is the real request: it returns the client's response object (a RESTResponse).
Send = Callable[[], Any]


@dataclass
class Rule:
    methods: frozenset[str] | None  # None: any method
    path: re.Pattern[str]
    nth: int
    times: int | None  # None: every match from nth on
    action: str
    delay: float = 0.0
    status: int = 500
    retry_after: float | None = None
    seen: int = 0  # matching requests so far

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Rule:
        unknown = set(raw) - _RULE_KEYS
        if unknown:
            # A typo must not turn a fault test into one that silently injects nothing.
            raise ValueError(f"fault rule: unknown keys {sorted(unknown)}")
        action = raw.get("action")
        if action not in ACTIONS:
            raise ValueError(f"fault rule: action must be one of {sorted(ACTIONS)}: {action!r}")
        method = raw.get("method", "*")
        methods: frozenset[str] | None
        if method == "*":
            methods = None
        elif method == "writes":
            methods = WRITES
        elif isinstance(method, str):
            methods = frozenset({method.upper()})
        else:
            methods = frozenset(m.upper() for m in method)
        times = raw.get("times", 1)
        if times != "all" and not (isinstance(times, int) and times >= 1):
            raise ValueError(f'fault rule: times must be a positive integer or "all": {times!r}')
        nth = raw.get("nth", 1)
        if not (isinstance(nth, int) and nth >= 1):
            raise ValueError(f"fault rule: nth must be a positive integer: {nth!r}")
        retry_after = raw.get("retry_after")
        return cls(
            methods=methods,
            path=re.compile(raw.get("path", "")),
            nth=nth,
            times=None if times == "all" else times,
            action=action,
            delay=float(raw.get("delay", 0.0)),
            status=int(raw.get("status", 500)),
            retry_after=None if retry_after is None else float(retry_after),
        )

    def matches(self, method: str, target: str) -> bool:
        return (self.methods is None or method in self.methods) and bool(self.path.search(target))

    def due(self) -> bool:
        """After counting this match: does the rule act on it?"""
        if self.seen < self.nth:
            return False
        return self.times is None or self.seen < self.nth + self.times


class Injector:
    def __init__(self, rules: list[Rule], log_path: str | None = None) -> None:
        self.rules = rules
        self._log_path = log_path
        self._lock = threading.Lock()  # requests come from many threads

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Injector:
        unknown = set(config) - {"rules", "log"}
        if unknown:
            raise ValueError(f"fault file: unknown keys {sorted(unknown)}")
        return cls([Rule.parse(r) for r in config.get("rules", [])], config.get("log"))

    @classmethod
    def load(cls, path: str) -> Injector:
        with open(path) as f:
            return cls.from_config(json.load(f))

    def _pick(self, method: str, target: str) -> tuple[int, Rule] | None:
        picked = None
        with self._lock:
            for i, rule in enumerate(self.rules):
                if rule.matches(method, target):
                    rule.seen += 1
                    if picked is None and rule.due():
                        picked = (i, rule)
        return picked

    def _log(self, index: int, rule: Rule, method: str, target: str) -> None:
        if not self._log_path:
            return
        line = json.dumps(
            {
                "time": time.time(),
                "pid": os.getpid(),
                "rule": index,
                "n": rule.seen,
                "action": rule.action,
                "method": method,
                "path": target,
            }
        )
        # One write() on an O_APPEND file: whole lines, even from several processes, and in
        # the kernel's hands before a SIGKILL that follows.
        fd = os.open(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def call(self, method: str, url: str, send: Send) -> Any:
        """The request `send` would make, with any fault that is due."""
        method = method.upper()
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        picked = self._pick(method, target)
        if picked is None:
            return send()
        index, rule = picked
        if rule.action == "late":
            self._log(index, rule, method, target)
            threading.Thread(target=_send_late, args=(send, rule.delay), daemon=True).start()
            raise urllib3.exceptions.ReadTimeoutError(
                None,  # type: ignore[arg-type] # no pool: the error only has to read like one
                url,
                f"injected fault: gave up, sent late ({method} {target})",
            )
        if rule.delay > 0:
            time.sleep(rule.delay)
        if rule.action in ("status", "timeout", "kill_before"):
            self._log(index, rule, method, target)
            if rule.action == "kill_before":
                os.kill(os.getpid(), signal.SIGKILL)
            if rule.action == "timeout":
                raise urllib3.exceptions.ConnectTimeoutError(
                    None, f"injected fault: connect timeout ({method} {target})"
                )
            return _status_response(rule)
        response = send()
        self._log(index, rule, method, target)
        if rule.action == "pass":
            return response
        if rule.action == "kill_after":
            os.kill(os.getpid(), signal.SIGKILL)
        _discard(response)
        raise urllib3.exceptions.ReadTimeoutError(
            None,  # type: ignore[arg-type] # no pool: the error only has to read like one
            url,
            f"injected fault: response lost ({method} {target})",
        )


def from_env(env: Mapping[str, str] = os.environ) -> Injector | None:
    """The injector the environment asks for; None (the normal case) when it asks none."""
    path = env.get(ENV)
    return Injector.load(path) if path else None


_REASONS = {
    404: "NotFound",
    409: "Conflict",
    410: "Gone",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def _status_response(rule: Rule) -> Any:
    """A response as the apiserver sends for an error: a Status body and the code."""
    # Imported here: the kubernetes client is heavy and only needed once a fault fires.
    from kubernetes.client import rest

    body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"injected fault: {rule.status}",
            "reason": _REASONS.get(rule.status, "Unknown"),
            "code": rule.status,
        }
    ).encode()
    headers = {"Content-Type": "application/json"}
    if rule.retry_after is not None:
        headers["Retry-After"] = f"{rule.retry_after:g}"
    raw = urllib3.HTTPResponse(
        body=body,
        headers=headers,
        status=rule.status,
        reason=_REASONS.get(rule.status, "Injected"),
        preload_content=False,
    )
    return rest.RESTResponse(raw)


def _send_late(send: Send, delay: float) -> None:
    """A late request's own thread: sent after `delay`, its answer (or error) unread."""
    time.sleep(delay)
    with contextlib.suppress(Exception):  # nobody waits for this answer any more
        _discard(send())


def _discard(response: Any) -> None:
    """Closes a dropped response's connection, as a lost response leaves it. (Draining it
    instead would block on a watch until the server ends the stream.)"""
    raw = getattr(response, "response", response)
    with contextlib.suppress(Exception):  # only tidying up after a lost response
        raw.close()
