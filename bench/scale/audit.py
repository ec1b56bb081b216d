"""kube-apiserver audit logging of the benchmark's clients, and counting their requests.

The policy logs metadata only, once per request (at ResponseComplete), and only for the users
the benchmark runs its clients as, so the log stays small and costs the apiserver little.
Counting by authenticated user works the same for both operators, whatever client library
they use.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torchrun_operator.api import timefmt


def policy(users: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted"],
        "rules": [{"level": "Metadata", "users": list(users)}, {"level": "None"}],
    }


def apiserver_flags(policy_file: str, log_file: str) -> list[str]:
    return [
        f"--audit-policy-file={policy_file}",
        f"--audit-log-path={log_file}",
        "--audit-log-format=json",
        "--audit-log-mode=batch",
        "--audit-log-batch-max-wait=1s",
        "--audit-log-maxsize=0",
    ]


@dataclass
class Requests:
    total: int = 0
    by_verb: Counter[str] = field(default_factory=Counter)
    by_resource: Counter[str] = field(default_factory=Counter)


def total(parts: Iterable[Requests]) -> Requests:
    """Several users' requests as one (an operator of several processes)."""
    out = Requests()
    for r in parts:
        out.total += r.total
        out.by_verb.update(r.by_verb)
        out.by_resource.update(r.by_resource)
    return out


def _events(lines: Iterable[str], user: str, start: float, end: float) -> Iterator[dict[str, Any]]:
    """The audit events of `user`'s requests received in [start, end]."""
    for line in lines:
        if user not in line:
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if (ev.get("user") or {}).get("username") != user:
            continue
        t = timefmt.seconds(ev.get("requestReceivedTimestamp"))
        if t is None or not start <= t <= end:
            continue
        yield ev


def _add(out: Requests, ev: dict[str, Any]) -> None:
    ref = ev.get("objectRef") or {}
    resource = str(ref.get("resource", ""))
    if ref.get("subresource"):
        resource += "/" + str(ref["subresource"])
    out.total += 1
    out.by_verb[str(ev.get("verb"))] += 1
    out.by_resource[resource] += 1


def count(lines: Iterable[str], user: str, start: float, end: float) -> Requests:
    """Requests `user` sent (received by the apiserver) in [start, end]."""
    out = Requests()
    for ev in _events(lines, user, start, end):
        _add(out, ev)
    return out


# What kube-controller-manager names its Job controller's client: ClientOrDie("job-controller").
JOB_CONTROLLER = "job-controller"


def agent_name(user_agent: str) -> str:
    """The client's name that client-go's AddUserAgent appends to its default user agent
    (`kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/1a2b3c4/job-controller` ->
    `job-controller`): how kube-controller-manager, one user for all its controllers when
    --use-service-account-credentials=false, names each controller's client. "" if none."""
    _, sep, rest = user_agent.partition(") kubernetes/")
    return rest.partition("/")[2] if sep else ""


def count_by_agent(
    lines: Iterable[str], user: str, start: float, end: float
) -> dict[str, Requests]:
    """`user`'s requests in [start, end] by the client name in their user agent."""
    out: dict[str, Requests] = {}
    for ev in _events(lines, user, start, end):
        _add(out.setdefault(agent_name(str(ev.get("userAgent") or "")), Requests()), ev)
    return out
