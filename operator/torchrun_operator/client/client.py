"""Client: submit, read, watch, wait for and delete DistributedTrainingJobs, and read a rank's
logs, from a laptop, a notebook or a pod. The thin I/O part: what it decides is in job.py."""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..api.models import JobSpec, JobStatus, RankStatus
from ..api.names import CLUSTER_RUNTIME_KIND, GROUP, PLURAL, VERSION, runtime_plural
from ..api.status_names import Phase
from .connect import connect
from .errors import JobFailed, JobNotFound, LogsUnavailable, RankNotFound, WaitTimeout
from .job import Job, job_object, rank_holder, root_cause, runtime_of

# One watch request lasts at most this long (the apiserver ends it; the next one resumes from
# the last resourceVersion): a connection a proxy dropped silently is noticed within it.
WATCH_SECONDS = 300
# Connect and read timeouts of the plain requests, so that an unreachable apiserver is an
# error, not a hang.
REQUEST_TIMEOUT = (10, 60)


class Client:
    """The SDK's entry point.

    `Client()` reads the kubeconfig ($KUBECONFIG, then ~/.kube/config; `kubeconfig=` and
    `context=` choose another) or, inside a pod, its service account; `Client(api_client)`
    uses an ApiClient you configured. `namespace` is where the jobs are: by default the
    context's (or the pod's), else "default"; every method also takes `namespace=`.
    """

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
    ) -> None:
        default_ns = "default"
        if api_client is None:
            api_client, default_ns = connect(kubeconfig, context)
        self.api_client = api_client
        self.namespace = namespace or default_ns
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    # ---- objects ---------------------------------------------------------------------------

    def submit(
        self,
        job: JobSpec | Mapping[str, Any],
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> Job:
        """Create the job: a JobSpec with `name`, or a whole object as a dict (as in YAML).
        The spec is validated first (pydantic's ValidationError names the field); a spec that
        names a runtime is validated merged onto it when the runtime can be read."""
        ns = namespace or self.namespace
        ref = runtime_of(job)
        runtime = self._runtime(ref, ns) if ref else None
        body = job_object(job, name, ns, runtime)
        created = self._custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, body, _request_timeout=REQUEST_TIMEOUT
        )
        return Job.from_object(created, runtime)  # type: ignore[arg-type]

    def _runtime(self, ref: tuple[str, str], namespace: str) -> Mapping[str, Any] | None:
        """The runtime a job names, None when it cannot be read (not there yet: the job waits
        for it; not readable with these credentials: the operator checks the merge)."""
        kind, name = ref
        try:
            if kind == CLUSTER_RUNTIME_KIND:
                obj = self._custom.get_cluster_custom_object(
                    GROUP, VERSION, runtime_plural(kind), name, _request_timeout=REQUEST_TIMEOUT
                )
            else:
                obj = self._custom.get_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    runtime_plural(kind),
                    name,
                    _request_timeout=REQUEST_TIMEOUT,
                )
        except ApiException as e:
            if e.status in (401, 403, 404):
                return None
            raise
        return obj if isinstance(obj, Mapping) else None

    def get(self, name: str, *, namespace: str | None = None) -> Job:
        ns = namespace or self.namespace
        try:
            obj = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as e:
            if e.status == 404:
                raise JobNotFound(ns, name) from None
            raise
        return Job.from_object(obj)  # type: ignore[arg-type]

    def list(
        self, *, namespace: str | None = None, all_namespaces: bool = False
    ) -> builtins.list[Job]:
        if all_namespaces:
            res: Any = self._custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _request_timeout=REQUEST_TIMEOUT
            )
        else:
            res = self._custom.list_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace or self.namespace,
                PLURAL,
                _request_timeout=REQUEST_TIMEOUT,
            )
        return [Job.from_object(o) for o in res.get("items", [])]

    def delete(self, name: str, *, namespace: str | None = None) -> None:
        """Delete the job; its pods, Service and ConfigMaps go with it (they are owned)."""
        ns = namespace or self.namespace
        try:
            self._custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                ns,
                PLURAL,
                name,
                propagation_policy="Background",
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as e:
            if e.status == 404:
                raise JobNotFound(ns, name) from None
            raise

    # ---- following a job -------------------------------------------------------------------

    def watch(
        self, name: str, *, namespace: str | None = None, timeout: float | None = None
    ) -> Iterator[Job]:
        """The job now, then each time its status changes; ends when the job is deleted or
        `timeout` seconds have passed (None: never). JobNotFound if it does not exist."""
        ns = namespace or self.namespace
        deadline = None if timeout is None else time.monotonic() + timeout
        last: JobStatus | None = None
        version: str | None = None
        while True:
            if version is None:
                job = self.get(name, namespace=ns)
                version = job.resource_version
                if job.status != last:
                    last = job.status
                    yield job
            left = WATCH_SECONDS if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return
            try:
                for kind, obj in self._events(ns, name, version, min(left, WATCH_SECONDS)):
                    if kind == "DELETED":
                        return
                    if kind == "ERROR":  # 410 Gone: the version is too old; read anew
                        version = None
                        break
                    if kind not in ("ADDED", "MODIFIED"):
                        continue
                    job = Job.from_object(obj)
                    version = job.resource_version
                    if job.status != last:
                        last = job.status
                        yield job
            except urllib3.exceptions.HTTPError:
                version = None  # a dropped connection: read anew, then watch again

    def _events(
        self, ns: str, name: str, version: str, seconds: float
    ) -> Iterator[tuple[str, Mapping[str, Any]]]:
        resp: Any = self._custom.list_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            PLURAL,
            field_selector=f"metadata.name={name}",
            resource_version=version,
            watch=True,
            timeout_seconds=max(1, int(seconds)),
            _preload_content=False,
            _request_timeout=(REQUEST_TIMEOUT[0], seconds + 30),
        )
        try:
            for line in _lines(resp):
                event = json.loads(line)
                if isinstance(event, dict) and isinstance(event.get("object"), dict):
                    yield str(event.get("type")), event["object"]
        finally:
            resp.release_conn()

    def wait(
        self, name: str, *, namespace: str | None = None, timeout: float | None = None
    ) -> JobStatus:
        """Wait until the job finished: its final status when it Succeeded; JobFailed, whose
        message is the root cause (rank, pod, node, error), when it Failed; WaitTimeout after
        `timeout` seconds; JobNotFound when it is (or gets) deleted."""
        ns = namespace or self.namespace
        start = time.monotonic()
        job: Job | None = None
        for job in self.watch(name, namespace=ns, timeout=timeout):
            if job.phase == Phase.SUCCEEDED:
                return job.status
            if job.phase == Phase.FAILED:
                raise JobFailed(job, root_cause(job))
        if timeout is not None and time.monotonic() - start >= timeout:
            raise WaitTimeout(job, timeout)
        raise JobNotFound(ns, name)

    def logs(
        self,
        name: str,
        rank: int = 0,
        *,
        follow: bool = False,
        namespace: str | None = None,
        container: str | None = None,
        previous: bool = False,
        tail_lines: int | None = None,
        timeout: float | None = None,
    ) -> Iterator[str]:
        """The log lines of the pod that holds global `rank` (its trainer container unless
        `container` says otherwise). With follow, first waits (up to `timeout`) for the
        rendezvous that assigns the rank, then streams until the container ends. RankNotFound
        when no pod holds it; LogsUnavailable when the apiserver cannot give the log."""
        ns = namespace or self.namespace
        job = self.get(name, namespace=ns)
        try:
            entry = rank_holder(job, rank)
        except RankNotFound:
            if not follow:
                raise
            job, entry = self._await_holder(name, ns, rank, timeout)
        if not entry.pod:
            raise RankNotFound(f"job {name}: rank {rank}'s pod is not created yet")
        kwargs: dict[str, Any] = {
            "follow": follow,
            "previous": previous,
            "container": container or job.spec.trainer.name,
        }
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        try:
            resp: Any = self._core.read_namespaced_pod_log(
                entry.pod, ns, _preload_content=False, **kwargs
            )
        except ApiException as e:
            where = f"pod {entry.pod} (node {entry.node or '-'}) holding rank {rank}"
            raise LogsUnavailable(
                f"cannot fetch the logs of {where}: {e.status} {e.reason}", e.status, e.body, entry
            ) from None
        try:
            for line in _lines(resp):
                yield line.decode(errors="replace")
        finally:
            resp.release_conn()

    def _await_holder(
        self, name: str, ns: str, rank: int, timeout: float | None
    ) -> tuple[Job, RankStatus]:
        """The job and the entry of the pod holding `rank`, once a rendezvous assigned it;
        RankNotFound when the job finished (or the wait ended) without one."""
        last: RankNotFound | None = None
        for job in self.watch(name, namespace=ns, timeout=timeout):
            try:
                return job, rank_holder(job, rank)
            except RankNotFound as e:
                last = e
                if job.finished:
                    break
        raise last or RankNotFound(f"job {name}: no pod holds rank {rank}")


def _lines(resp: Any) -> Iterator[bytes]:
    """The lines of a streamed response body, without their line ends, as they arrive."""
    pending = b""
    for chunk in resp.stream(4096, decode_content=False):
        pending += chunk
        *whole, pending = pending.split(b"\n")
        yield from whole
    if pending:
        yield pending
