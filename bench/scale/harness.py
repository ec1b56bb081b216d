"""The benchmark's I/O: a local control plane with apiserver audit logging and no process
node, KWOK and its fake GPU nodes, the operators as local processes, raw watches, and
parallel clients. Decisions and arithmetic live in figures.py and report.py."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from localkube import procs
from localkube.controlplane import Cluster
from localkube.testing import namespace_gone, wait_for

from . import audit
from .figures import JobObs, PodObs, job_obs, jobset_obs, pod_obs
from .workloads import GPUS_PER_NODE, KUBEFLOW, OURS, TRAINER

REPO = Path(__file__).resolve().parents[2]
STAGES = REPO / "bench" / "kwok" / "stages.yaml"
OUR_CRD = REPO / "crds" / "torchrun.dev_distributedtrainingjobs.yaml"
FAKE_NODE = "kwok.x-k8s.io/node"
USERS = {OURS: "bench-torchrun-operator", KUBEFLOW: "bench-training-operator"}
# Trainer v2 + JobSet: two processes, each with its own user; the kind's requests are both's.
TRAINER_USER = "bench-trainer-controller-manager"
JOBSET_USER = "bench-jobset-controller"
OPERATOR_USERS = {**{k: [u] for k, u in USERS.items()}, TRAINER: [TRAINER_USER, JOBSET_USER]}
DIRECT_USER = "bench-direct-client"
# kube-controller-manager (all its controllers; audit.agent_name tells them apart).
KCM_USER = "bench-kube-controller-manager"


class BenchError(RuntimeError):
    """The benchmark cannot go on; the message says why."""


class BenchCluster(Cluster):
    """A localkube cluster whose apiserver writes an audit log of the benchmark's users, and
    whose kube-controller-manager runs as a user of its own (KCM_USER, so the audit log can
    count its requests: localkube's runs as the admin, as the benchmark's own client does)
    with extra flags that set_controller_manager_flags can change between runs."""

    audit_flags: list[str] = []
    controller_manager_flags: list[str] = []
    _controller_manager_argv: list[str] = []

    def _launch(
        self, component: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        if component == "kube-apiserver":
            argv = [*argv, *self.audit_flags]
        if component == "kube-controller-manager":
            self._controller_manager_argv = argv
            own = self.mint_kubeconfig(KCM_USER, ["system:masters"])
            # The last of a repeated flag wins: these override localkube's.
            argv = [*argv, f"--kubeconfig={own}", *self.controller_manager_flags]
        return super()._launch(component, argv, env)

    def set_controller_manager_flags(self, flags: list[str], timeout: float = 60) -> bool:
        """Restarts kube-controller-manager with `flags` unless it runs with them already;
        True if it did. Its controllers list everything again when it starts, so a run begins
        only once it answers /healthz (and the caller lets its informers settle)."""
        if list(flags) == self.controller_manager_flags:
            return False
        component = "kube-controller-manager"
        procs.stop(self._read_pids()[component], grace=10)
        self.controller_manager_flags = list(flags)
        proc = self._launch(component, self._controller_manager_argv)
        url = f"https://127.0.0.1:{self.ports.controller_manager}/healthz"
        ctx = procs.insecure_context()
        procs.wait_until(component, lambda: procs.http_ok(url, ctx), proc, self._log(component),
                         timeout)  # fmt: skip
        return True

    def controller_manager_pid(self) -> int:
        return self._read_pids()["kube-controller-manager"]


def api_client(kubeconfig: Path, pool: int = 32) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def parallel(items: Iterable[Any], fn: Callable[[Any], Any], threads: int = 16) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, items))


def raw(
    api: client.ApiClient,
    method: str,
    path: str,
    query: list[tuple[str, str]] | None = None,
    body: dict[str, Any] | None = None,
    stream: bool = False,
) -> Any:
    """One request without the Python client's models (slow at this scale): the urllib3
    response, read unless `stream`. Raises ApiException on an error status."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    _, url, headers, data, _ = api.param_serialize(
        method=method, resource_path=path, query_params=query or [], header_params=headers,
        body=body, auth_settings=["BearerToken"],
    )  # fmt: skip
    resp = api.call_api(method, url, header_params=headers, body=data).response
    if resp.status >= 400:
        text = resp.data.decode(errors="replace")
        raise ApiException(status=resp.status, reason=f"{method} {path}: {text[:500]}")
    if not stream:
        resp.data  # noqa: B018 - read it all, so the connection goes back to the pool
        resp.release_conn()
    return resp


def create_raw(api: client.ApiClient, path: str, body: dict[str, Any]) -> None:
    raw(api, "POST", path, body=body)


# ---- cluster, KWOK, nodes -------------------------------------------------------------------


def kwok_argv(bin_dir: Path, kubeconfig: Path, cidr: str) -> list[str]:
    return [
        str(bin_dir / "kwok"),
        f"--kubeconfig={kubeconfig}",
        f"--manage-nodes-with-annotation-selector={FAKE_NODE}=fake",
        f"--config={STAGES}",
        f"--cidr={cidr}",
        "--node-ip=10.255.255.254",
        "--node-lease-duration-seconds=40",
        "--v=WARN",
    ]


def fake_node(name: str) -> dict[str, Any]:
    capacity = {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name},
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def create_nodes(api: client.ApiClient, count: int) -> None:
    parallel(
        (fake_node(f"kwok-{i:04d}") for i in range(count)),
        lambda n: create_raw(api, "/api/v1/nodes", n),
    )

    def ready() -> int:
        n = 0
        nodes = json.loads(raw(api, "GET", "/api/v1/nodes", [("labelSelector", "type=kwok")]).data)
        for node in nodes["items"]:
            conds = {c["type"]: c["status"] for c in node["status"].get("conditions") or []}
            taints = {t["key"] for t in node["spec"].get("taints") or []}
            n += conds.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints
        return n

    wait("fake nodes Ready", lambda: ready() >= count, 180)


def wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    try:
        return wait_for(what, check, timeout, interval)
    except TimeoutError as e:
        raise BenchError(str(e)) from None


def apply_crd(api: client.ApiClient, crd: dict[str, Any]) -> None:
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    name = crd["metadata"]["name"]
    try:
        raw(api, "POST", path, body=crd)
    except ApiException as e:
        if e.status != 409:
            raise

    def established() -> bool:
        got = json.loads(raw(api, "GET", f"{path}/{name}").data)
        conds = got.get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    wait(f"CRD {name} established", established, 60)


def clean_namespace(api: client.ApiClient, ns: str, kinds: list[tuple[str, str]]) -> None:
    """Deletes everything a run left, jobs first (the operators are stopped by then), then
    the namespace; waits until no pod is left so the next run starts on an idle cluster, and
    until the namespace is gone: the same workload and kind at the next limit setting creates
    it again, which a terminating namespace refuses (403)."""
    for path in [*(f"/apis/{gv}/namespaces/{ns}/{plural}" for gv, plural in kinds),
                 f"/api/v1/namespaces/{ns}/pods", f"/api/v1/namespaces/{ns}/services",
                 f"/api/v1/namespaces/{ns}/configmaps"]:  # fmt: skip
        try:
            raw(api, "DELETE", path, query=[("gracePeriodSeconds", "0")])
        except ApiException as e:
            if e.status != 404:
                raise
    core = client.CoreV1Api(api)
    core.delete_namespace(ns)
    wait(f"pods of {ns} gone", lambda: not core.list_namespaced_pod(ns, limit=1).items, 180)
    wait(f"namespace {ns} gone", lambda: namespace_gone(api, ns), 180)


# ---- watching ---------------------------------------------------------------------------------


class Recorder:
    """Raw watches (JSON lines, no model objects) on a namespace's pods and jobs; every event
    stamped with this process's clock on arrival."""

    def __init__(self, api: client.ApiClient, ns: str, kind: str, job_label: str) -> None:
        self.api, self.ns, self.kind, self.job_label = api, ns, kind, job_label
        self.pods: list[PodObs] = []
        self.jobs: list[JobObs] = []
        self.restarts: list[JobObs] = []  # Trainer: its JobSets' restart counters
        self._stop = threading.Event()
        self._responses: list[Any] = []
        self.errors: list[str] = []
        self.relists = 0
        self._last: dict[str, PodObs] = {}

    def _paths(self) -> list[tuple[str, Callable[[float, str, dict[str, Any]], None]]]:
        ns = f"namespaces/{self.ns}"
        if self.kind == OURS:
            return [(f"/apis/torchrun.dev/v1alpha1/{ns}/distributedtrainingjobs", self._on_job)]
        if self.kind == KUBEFLOW:
            return [(f"/apis/kubeflow.org/v1/{ns}/pytorchjobs", self._on_job)]
        if self.kind == TRAINER:
            return [
                (f"/apis/trainer.kubeflow.org/v1alpha1/{ns}/trainjobs", self._on_job),
                (f"/apis/jobset.x-k8s.io/v1alpha2/{ns}/jobsets", self._on_jobset),
            ]
        return []

    def start(self) -> None:
        self._watch(f"/api/v1/namespaces/{self.ns}/pods", self._on_pod)
        for path, on in self._paths():
            self._watch(path, on)

    def _on_pod(self, t: float, event: str, obj: dict[str, Any]) -> None:
        obs = pod_obs(t, event, obj, self.job_label)
        last = self._last.get(obs.uid)
        if obs.gone and not obs.name and last is not None:  # a deletion found by a re-list
            obs = PodObs(t, obs.uid, last.name, last.job, last.phase, True, True)
        self._last[obs.uid] = obs
        self.pods.append(obs)

    def _on_job(self, t: float, event: str, obj: dict[str, Any]) -> None:
        self.jobs.append(job_obs(t, self.kind, obj))

    def _on_jobset(self, t: float, event: str, obj: dict[str, Any]) -> None:
        self.restarts.append(jobset_obs(t, obj))

    def _watch(self, path: str, on: Callable[[float, str, dict[str, Any]], None]) -> None:
        """Watches from an empty start; when the apiserver drops the watch (it closes watchers
        that fall behind, which a loaded 2-core machine makes happen), lists again, records
        what changed meanwhile (stamped at that moment, so late rather than lost, and
        counted in `relists`) and watches on."""
        known: dict[str, str] = {}  # uid -> resourceVersion last seen

        def emit(t: float, event: str, obj: dict[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            uid = str(meta.get("uid"))
            if event == "DELETED":
                known.pop(uid, None)
            else:
                known[uid] = str(meta.get("resourceVersion"))
            on(t, event, obj)

        def relist(first: bool) -> str:
            listing = json.loads(raw(self.api, "GET", path).data)
            t = time.time()
            items = listing.get("items") or []
            if not first:
                self.relists += 1
                now = {str(i["metadata"]["uid"]) for i in items}
                for item in items:
                    meta = item["metadata"]
                    if known.get(str(meta["uid"])) != str(meta.get("resourceVersion")):
                        emit(t, "MODIFIED", item)
                for uid in [u for u in known if u not in now]:
                    emit(t, "DELETED", {"metadata": {"uid": uid}, "status": {}})
            else:
                for item in items:
                    emit(t, "ADDED", item)
            return str(listing["metadata"]["resourceVersion"])

        def stream(rv: str) -> None:
            query = [("watch", "true"), ("resourceVersion", rv), ("timeoutSeconds", "3600")]
            resp = raw(self.api, "GET", path, query=query, stream=True)
            self._responses.append(resp)
            buf = b""
            for chunk in resp.stream(65536, decode_content=True):
                t = time.time()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    if ev.get("type") == "ERROR":
                        return  # e.g. 410 Gone: list again
                    emit(t, str(ev.get("type")), ev.get("object") or {})

        rv0 = relist(first=True)

        def loop() -> None:
            rv = rv0
            try:
                while not self._stop.is_set():
                    stream(rv)
                    if self._stop.is_set():
                        return
                    rv = relist(first=False)
            except Exception as e:  # a closed stream at stop() is expected
                if not self._stop.is_set():
                    self.errors.append(f"{path}: {e!r}")

        threading.Thread(target=loop, daemon=True, name=f"watch {path}").start()

    def check(self) -> bool:
        """True while every watch is healthy; raises with the first watch error."""
        if self.errors:
            raise BenchError(f"watch failed: {self.errors[0]}")
        return True

    def stop(self) -> None:
        self._stop.set()
        for resp in self._responses:
            with contextlib.suppress(Exception):
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()


# ---- audit log --------------------------------------------------------------------------------


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def offset(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def count(
        self, users: list[str], start: float, end: float, offset: int
    ) -> dict[str, audit.Requests]:
        """Each user's requests (audit.total sums them)."""
        time.sleep(1.5)  # batch mode flushes within a second
        out = {}
        for user in users:
            with self.path.open() as f:
                f.seek(offset)
                out[user] = audit.count(f, user, start, end)
        return out

    def by_agent(
        self, user: str, start: float, end: float, offset: int
    ) -> dict[str, audit.Requests]:
        """`user`'s requests by client name (call after count(), which waits for the flush)."""
        with self.path.open() as f:
            f.seek(offset)
            return audit.count_by_agent(f, user, start, end)


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback only
        return r.read().decode()
