"""Kubernetes client set-up: in-cluster config when in a pod, else the kubeconfig.

Every request gets a client-side timeout. Without one, a request to an apiserver that stops
answering (a dead connection behind a load balancer, an apiserver stuck in a restart) blocks
its thread forever: a worker, the pod watch or the leader election would hang without dying,
which no liveness probe notices.

Writes (POST, PUT, PATCH, DELETE) of a client with a leadership gate (kube/leader.Gate) are
checked against it right before they are sent, and refused with leader.FencedError
once this replica's term is over; and each is bounded as a whole by a deadline computed at
that moment (leader.write_deadline): it ends before a standby could start, so a write sent
early in a term may wait for a slow apiserver as long as the apiserver itself would, and one
sent just before the fence is given up on in time. The Lease's own writes go through a
client without a gate (ApiClient.ungated).

Every write's latency, and the writes that timed out or were answered 429, 503 or 504 (the
apiserver too busy, or it gave up), are recorded in the metrics (docs/metrics.md); is_slow
tells the controller which failures are a slow control plane rather than a refusal.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from torchrun_operator import metrics
from torchrun_operator.kube import faults
from torchrun_operator.kube.leader import Gate
from torchrun_operator.kube.ratelimit import TokenBucket

log = logging.getLogger(__name__)

# A reachable apiserver accepts a connection in milliseconds; 5 s rides out one lost SYN
# (the kernel retransmits after 1 s, then 3 s) and still fails fast when it is gone.
CONNECT_TIMEOUT_SECONDS = 5.0
# urllib3's read timeout bounds each wait for bytes, not the whole response, so a big list
# that streams steadily is not cut off. The apiserver gives up on a request after 60 s
# (--request-timeout); 30 s of silence on one of our small requests already means trouble.
READ_TIMEOUT_SECONDS = 30.0
REQUEST_TIMEOUT = (CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS)
# For clients that only take a total (kopf's): the apiserver ends any request that is not a
# watch after 60 s (--request-timeout), so waiting longer for a response is waiting for none.
APISERVER_REQUEST_TIMEOUT_SECONDS = 60.0
# A gated write's deadline, connect and answer together (urllib3's total), is computed when
# it is sent (leader.write_deadline, capped by APISERVER_REQUEST_TIMEOUT_SECONDS): the last
# write a deposed leader sends leaves at its fence at the latest (the gate is checked right
# before it is sent) with a deadline of the fence's margin less a second, and a standby takes
# over a margin after the fence at the soonest; so nothing of ours is in flight on our side
# when the new leader starts. (The apiserver may still be busy with it, as it may with any
# client-go controller's: that part is beyond a client.) A write sent earlier in the term
# waits longer: an apiserver that answers in 10 s is slow, not down.
WRITES = faults.WRITES
# urllib3 would send a request again by itself: a PUT or DELETE whose answer timed out, and
# any request after a failed connect (3 times by default, 5 s each). Such a second attempt
# leaves after the gate was checked, maybe after the fence; so none is made, and the caller
# (a reconcile that backs off, a watch's loop, the next renewal) tries again instead.
RETRIES = urllib3.Retry(total=3, connect=0, read=0)

# Watches: the server ends each one after this long (timeoutSeconds) and we resume from the
# last resourceVersion. Bookmarks are sent at the server's discretion, so only this bounds
# how long a healthy, idle stream may stay silent: the client waits that long plus a grace
# before it takes the stream for dead. (TCP keepalive, on by default in the client, notices
# a vanished peer sooner: 30 s idle + 9 probes 15 s apart.)
WATCH_TIMEOUT_SECONDS = 300
WATCH_GRACE_SECONDS = 30.0
WATCH_REQUEST_TIMEOUT = (CONNECT_TIMEOUT_SECONDS, WATCH_TIMEOUT_SECONDS + WATCH_GRACE_SECONDS)


class ApiClient(client.ApiClient):
    """The kubernetes ApiClient with a default timeout on every request, the leadership gate
    on every write and, in tests only, fault injection (kube/faults.py). call_api is the one
    method every API call (watches included) goes through with the method, URL and timeout
    in hand."""

    def __init__(
        self,
        configuration: client.Configuration | None = None,
        request_timeout: Any = REQUEST_TIMEOUT,
        injector: faults.Injector | None = None,
        gate: Gate | None = None,
        limiter: TokenBucket | None = None,
    ) -> None:
        super().__init__(configuration)
        self.request_timeout = request_timeout
        self.injector = injector
        self.gate = gate
        self.limiter = limiter

    def ungated(self) -> ApiClient:
        """A client like this one whose writes pass no gate: the leader election's own (its
        Lease writes are how a term is won). Same configuration and fault injector; no rate
        limit either: a renewal queued behind a burst of creates would lose the term."""
        return ApiClient(self.configuration, self.request_timeout, self.injector)

    def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        timeout = self.request_timeout if _request_timeout is None else _request_timeout
        verb = method.upper()
        write = verb in WRITES
        gate = self.gate if write else None

        def sent(timeout: Any) -> Any:
            started = time.monotonic()
            outcome: str | None = None
            try:
                resp = client.ApiClient.call_api(
                    self, method, url, header_params, body, post_params, _request_timeout=timeout
                )
                outcome = slow_answer(getattr(resp, "status", None))
                return resp
            except ApiException as e:
                outcome = slow_answer(e.status)
                raise
            except urllib3.exceptions.HTTPError as e:
                outcome = "timeout" if timed_out(e) else None
                raise
            finally:
                if write:
                    metrics.observe_write(verb.lower(), time.monotonic() - started, outcome)

        def send() -> Any:
            if gate is None:
                return sent(timeout)
            # Here, after the rate limit's wait and any injected delay, right before the
            # request leaves: the gate's check and the deadline from one reading of its clock.
            what = f"{method} {url.split('?', 1)[0]}"
            with gate.sending(what, APISERVER_REQUEST_TIMEOUT_SECONDS) as deadline:
                return sent(_within(_request_timeout, deadline))

        if self.limiter is not None:
            # Before the gate: a write that waited here is still checked right before it goes.
            self.limiter.wait()
        return send() if self.injector is None else self.injector.call(method, url, send)


def _within(asked: Any, deadline: float) -> float:
    """A gated write's timeout: its deadline, or the caller's own total when that is
    shorter (a caller's (connect, read) pair bounds no whole exchange: the deadline does)."""
    if isinstance(asked, int | float) and not isinstance(asked, bool):
        return min(float(asked), deadline)
    return deadline


# The answers that say the apiserver is too busy (429: priority and fairness shed the request;
# 503: it is not ready, or overloaded) or gave up on the request itself (504, its
# --request-timeout or a webhook's): slow, not refused. Each is a label of the slow-writes
# metric, as is "timeout" (our own deadline ran out).
SLOW_CODES = (429, 503, 504)


def slow_answer(status: int | None) -> str | None:
    """The slow-writes metric's outcome for an answer with `status`; None for any other."""
    return str(status) if status in SLOW_CODES else None


def timed_out(e: BaseException) -> bool:
    """Whether the request was given up on while waiting for its answer (urllib3's read
    timeout, or our write's total running out), also when urllib3 wraps it in MaxRetryError.
    Not a connect timeout: an apiserver that accepts no connection in time is away, not
    slow."""
    if isinstance(e, urllib3.exceptions.MaxRetryError):
        e = e.reason if e.reason is not None else e
    return isinstance(e, urllib3.exceptions.ReadTimeoutError)


def is_slow(e: BaseException) -> bool:
    """A failure that says the control plane is slow, not that the request is wrong: a
    429, 503 or 504 answer, or no answer in time. The request may well be right next time."""
    if isinstance(e, ApiException):
        return e.status in SLOW_CODES
    return timed_out(e)


JSON = "application/json"
JSON_PATCH = "application/json-patch+json"


def request(
    api: client.ApiClient,
    method: str,
    path: str,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    content_type: str = JSON,
    timeout: Any = None,
) -> Any:
    """One request past the generated API classes; its urllib3 response, body unread (a
    watch streams it). A non-2xx answer raises ApiException, as the generated methods do.

    Those methods validate every argument with pydantic (a whole V1Pod built from our dict
    for each create, then serialised back): a profile of the operator with 100 jobs found
    that wrapper in 16% of its samples. And their classes are costly to load: CoreV1Api
    alone, with the models it imports, is 21 MiB of the operator's memory. Here the dict goes
    to the wire as it is. Auth, default headers, the client's timeout, rate limit, gate and
    fault injection (ApiClient.call_api) are the same as for any call.
    """
    verb, url, headers, _, _ = api.param_serialize(
        method,
        path,
        query_params=query,
        header_params={"Accept": JSON, "Content-Type": content_type},
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(verb, url, headers, body, _request_timeout=timeout)
    if not 200 <= resp.status <= 299:
        data: bytes = resp.read()
        raise ApiException.from_response(http_resp=resp, body=data.decode(), data=None)
    return resp.response


def send(
    api: client.ApiClient, method: str, path: str, body: Any = None, content_type: str = JSON
) -> Any:
    """One request with a JSON body and answer (request()); the answer decoded."""
    return json.loads(request(api, method, path, body=body, content_type=content_type).data)


# The list and watch parameters our watchers pass, as the generated methods name them, and
# as the apiserver does. kubernetes.watch.Watch.stream adds `watch`.
_LIST_QUERY = {
    "label_selector": "labelSelector",
    "resource_version": "resourceVersion",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}


def lister(api: client.ApiClient, collection: str) -> Callable[..., Any]:
    """A list of one collection, called as the generated list methods are (and as
    kubernetes.watch.Watch.stream calls them, `watch=True` for a watch); the raw response,
    whatever `_preload_content` asks (we decode every body ourselves)."""

    def call(*, _preload_content: bool = False, _request_timeout: Any = None, **kw: Any) -> Any:
        unknown = set(kw) - set(_LIST_QUERY)
        if unknown:
            raise TypeError(f"lister: unknown parameters {sorted(unknown)}")
        query = [(_LIST_QUERY[k], v) for k, v in kw.items() if v is not None]
        return request(api, "GET", collection, query, timeout=_request_timeout)

    return call


def path(*parts: str) -> str:
    """A URL path from segments (names are quoted, as the generated methods quote them)."""
    return "/" + "/".join(quote(p, safe="") for p in parts)


_CORE_PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Event": "events",
}


def collection(kind: str, ns: str | None = None) -> str:
    """The path of a kind's objects in namespace `ns`, or in every namespace (None)."""
    group: tuple[str, ...] = ("api", "v1")
    if kind == "NetworkPolicy":
        group, plural = ("apis", "networking.k8s.io", "v1"), "networkpolicies"
    else:
        plural = _CORE_PLURALS[kind]
    return path(*group, plural) if ns is None else path(*group, "namespaces", ns, plural)


def custom_collection(group: str, version: str, plural: str, ns: str | None = None) -> str:
    """The path of a custom resource's objects in namespace `ns`, or in every namespace."""
    if ns is None:
        return path("apis", group, version, plural)
    return path("apis", group, version, "namespaces", ns, plural)


class Writes:
    """The controller's hot requests (children created and read back, pods deleted, the
    status written), each one request through send(). The seam the controller's unit tests
    replace."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def get(self, ns: str, kind: str, name: str) -> Any:
        """The named Pod, Service, ConfigMap or NetworkPolicy; 404 raises ApiException."""
        return send(self.api, "GET", collection(kind, ns) + path(name))

    def create(self, ns: str, obj: Mapping[str, Any]) -> Any:
        """Creates a Pod, Service, ConfigMap, Event or NetworkPolicy; the created object."""
        return send(self.api, "POST", collection(obj["kind"], ns), obj)

    def delete_pod(self, ns: str, name: str, uid: str | None, force: bool = False) -> Any:
        """Deletes the pod, only if it still has `uid` when one is given (409 otherwise);
        the pod as marked for deletion, or a Status. `force`: a grace period of 0, which
        removes the pod without waiting for its kubelet (reconcile/overdue.py)."""
        options: dict[str, Any] = {"preconditions": {"uid": uid}} if uid else {}
        if force:
            options["gracePeriodSeconds"] = 0
        return send(self.api, "DELETE", collection("Pod", ns) + path(name), options or None)

    def patch_status(
        self, group: str, version: str, ns: str, plural: str, name: str, patch: list[Any]
    ) -> Any:
        """A JSON patch of a custom object's status subresource; the object written."""
        url = path("apis", group, version, "namespaces", ns, plural, name, "status")
        return send(self.api, "PATCH", url, patch, JSON_PATCH)


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """The apiserver's URL inside a pod, from KUBERNETES_SERVICE_HOST/PORT as client-go and
    the kubernetes client find it; None outside a pod. (kopf's own service-account login
    assumes https://kubernetes.default.svc, which needs cluster DNS and a service proxy.)"""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"https://{host}:{port}"


def load(
    env: Mapping[str, str] = os.environ,
    gate: Gate | None = None,
    limiter: TokenBucket | None = None,
) -> ApiClient:
    """The client for the operator's requests; with `gate`, its writes are fenced by it, and
    with `limiter`, every request waits for its token (kube/ratelimit.py)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    cfg = client.Configuration.get_default_copy()
    # One operator talks to the apiserver from many threads (workers, creates in parallel).
    cfg.connection_pool_maxsize = 32
    cfg.retries = RETRIES
    injector = faults.from_env(env)
    if injector is not None:
        log.warning(
            "fault injection is ON (%s=%s): %d rules",
            faults.ENV,
            env[faults.ENV],
            len(injector.rules),
        )
    return ApiClient(cfg, injector=injector, gate=gate, limiter=limiter)


def api_message(e: ApiException) -> str:
    """The apiserver's own words from an error (its Status message), else the reason."""
    try:
        body = json.loads(e.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or e.reason or e.status)


# Answers a client is told to come back later to, with when in Retry-After.
RETRY_AFTER_CODES = (429, 503)
# The longest Retry-After obeyed, by the controller's retries and the watches' re-lists alike.
# The apiserver's priority and fairness asks for a second or so; a header of hours (a broken
# proxy) must not leave a job, or every job's pod events, waiting that long.
RETRY_AFTER_MAX_SECONDS = 60.0


def retry_after(e: BaseException) -> float | None:
    """The seconds a 429 or 503 answer's Retry-After asks for (the apiserver sends whole
    seconds; an HTTP date is not worth a parser here), bounded; None when it asks none. The
    one reading of the header: the controller's retries and the watches' use it."""
    if not isinstance(e, ApiException) or e.status not in RETRY_AFTER_CODES:
        return None
    headers = e.headers or {}
    value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None)
    try:
        seconds = float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, RETRY_AFTER_MAX_SECONDS)


def invalid_fields(e: ApiException) -> list[str]:
    """The fields a 422 (Invalid) answer names: its Status details' causes, as the apiserver
    writes them for a body that fails validation ("status.ranks[0].pod", ...)."""
    try:
        body = json.loads(e.body or "{}")
    except (TypeError, ValueError):
        return []
    details = body.get("details") if isinstance(body, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    fields = [c.get("field") for c in causes or [] if isinstance(c, dict)]
    return sorted({f for f in fields if isinstance(f, str) and f})


T = TypeVar("T")


def get_or_none(kind: str, call: Callable[[], T]) -> T | None:
    """A read, counted in the API-request metric by its answer: None when the object does not
    exist (404); any other refusal raises."""
    try:
        got = call()
    except ApiException as e:
        metrics.count_api_call("get", kind.lower(), e.status or 0)
        if e.status == 404:
            return None
        raise
    metrics.count_api_call("get", kind.lower(), 200)
    return got
