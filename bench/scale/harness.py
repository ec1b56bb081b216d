"""The benchmark's I/O: a local control plane with apiserver audit logging and no process
node, KWOK and its fake GPU nodes, the operators as local processes, raw watches, and
parallel clients. Decisions and arithmetic live in figures.py and report.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from localkube import gomod, procs
from localkube.controlplane import Cluster
from localkube.testing import create_namespace, wait_for

from . import audit
from .figures import JobObs, PodObs, job_obs, jobset_obs, pod_obs
from .workloads import GPUS_PER_NODE, KUBEFLOW, OURS, TRAINER

REPO = Path(__file__).resolve().parents[2]
STAGES = REPO / "bench" / "kwok" / "stages.yaml"
OUR_CRD = REPO / "crds" / "torchrun.dev_distributedtrainingjobs.yaml"
KUBEFLOW_MODULE = "github.com/kubeflow/training-operator"
KUBEFLOW_VERSION = os.environ.get("TRAINING_OPERATOR_VERSION", "v1.9.3")
KUBEFLOW_NS = "kubeflow"
KUBEFLOW_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # fixed in its pkg/cert
FAKE_NODE = "kwok.x-k8s.io/node"
USERS = {OURS: "bench-torchrun-operator", KUBEFLOW: "bench-training-operator"}
# Trainer v2 + JobSet: two processes, each with its own user; the kind's requests are both's.
TRAINER_USER = "bench-trainer-controller-manager"
JOBSET_USER = "bench-jobset-controller"
OPERATOR_USERS = {**{k: [u] for k, u in USERS.items()}, TRAINER: [TRAINER_USER, JOBSET_USER]}
DIRECT_USER = "bench-direct-client"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# py-spy's sampling rate (Hz) for --profile: enough samples in a one-minute run, and light
# enough (it reads the process's memory from outside) not to slow the operator it measures.
PROFILE_RATE = 97


class BenchError(RuntimeError):
    """The benchmark cannot go on; the message says why."""


class BenchCluster(Cluster):
    """A localkube cluster whose apiserver writes an audit log of the benchmark's users."""

    audit_flags: list[str] = []

    def _launch(
        self, component: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        if component == "kube-apiserver":
            argv = [*argv, *self.audit_flags]
        return super()._launch(component, argv, env)


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


def kubeflow_module_dir() -> Path:
    """The training-operator module in the Go module cache (cluster/build.sh put it there)."""
    try:
        return gomod.module_dir(KUBEFLOW_MODULE, KUBEFLOW_VERSION)
    except RuntimeError as e:
        raise BenchError(str(e)) from e


def clean_namespace(api: client.ApiClient, ns: str, kinds: list[tuple[str, str]]) -> None:
    """Deletes everything a run left, jobs first (the operators are stopped by then), then
    the namespace; waits until no pod is left so the next run starts on an idle cluster."""
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


# ---- operators --------------------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def proc_peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class OperatorProc:
    """One operator process, started fresh for every run."""

    kind = ""
    # --profile: a folder for py-spy's collapsed stacks, one file per run (Python only). Class
    # defaults, so that kinds made of several processes (TrainerJobSet) have them too.
    profile_dir: Path | None = None
    profile_label = ""
    _spy: subprocess.Popen[bytes] | None = None
    name = ""  # the log's name, if not the kind's

    def __init__(self, cluster: Cluster, workdir: Path, bin_dir: Path) -> None:
        self.cluster, self.workdir, self.bin_dir = cluster, workdir, bin_dir
        self.kubeconfig = cluster.mint_kubeconfig(self.user, ["system:masters"])
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.cpu0 = 0.0

    @property
    def user(self) -> str:
        return USERS[self.kind]

    @property
    def users(self) -> list[str]:
        """Whose API requests are this operator's (audit log users)."""
        return [self.user]

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name or self.kind}-{self.runs}.log"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ, KUBECONFIG=str(self.kubeconfig))

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        self.runs += 1
        self.proc = procs.start(self.argv(), self.log_path, env=self.env(), die_with_parent=True)

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise BenchError(
                    f"{self.kind} exited ({self.proc.returncode}):\n"
                    + procs.log_tail(self.log_path)
                )
            return self.ready()

        wait(f"{self.kind} ready", up, 120)
        time.sleep(1.0)  # its informers list and settle
        self.cpu0 = proc_cpu_seconds(self.proc.pid)
        if self.profile_dir is not None:
            out = self.profile_dir / f"{self.profile_label}.txt"
            self._spy = start_profiler(self.proc.pid, out)

    def stop_profiler(self) -> None:
        """Ends the run's profile: py-spy writes its file when interrupted."""
        if self._spy is not None and self._spy.poll() is None:
            self._spy.send_signal(2)
            try:
                self._spy.wait(30)
            except subprocess.TimeoutExpired:
                self._spy.kill()
        self._spy = None

    def usage(self) -> tuple[float, float]:
        """CPU seconds since start() returned, and peak RSS (MiB) of the whole process life."""
        assert self.proc is not None
        return proc_cpu_seconds(self.proc.pid) - self.cpu0, proc_peak_rss_mib(self.proc.pid)

    def stop(self) -> None:
        self.stop_profiler()
        if self.proc is not None and self.proc.poll() is None:
            procs.stop(self.proc.pid, grace=10)
            self.proc.wait()


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy attached to `pid`, writing collapsed stacks (one line per stack and its sample
    count) to `out` when it stops. `--gil`: only the thread holding the GIL is sampled, so
    the samples are where the interpreter's CPU goes, not threads blocked in I/O or waits."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise BenchError("--profile needs py-spy (pip install py-spy)")
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [spy, "record", "--pid", str(pid), "--rate", str(PROFILE_RATE), "--format", "raw",
            "--gil", "--threads", "--output", str(out)]  # fmt: skip
    with open(f"{out}.log", "wb") as log:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)


class Ours(OperatorProc):
    kind = OURS

    def __init__(self, cluster: Cluster, workdir: Path, bin_dir: Path, workers: int) -> None:
        super().__init__(cluster, workdir, bin_dir)
        self.workers = workers
        self.port = 0

    def argv(self) -> list[str]:
        self.port = procs.free_port()
        return [
            sys.executable, "-m", "torchrun_operator.main", "--all-namespaces",
            "--liveness-port", "0", "--metrics-port", str(self.port),
            "--workers", str(self.workers),
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), env.get("PYTHONPATH", "")])
        return env

    def ready(self) -> bool:
        return procs.http_ok(f"http://127.0.0.1:{self.port}/metrics")


class Kubeflow(OperatorProc):
    """training-operator v1 as a local process: PyTorchJob only, gang scheduling off (no
    --gang-scheduler-name), its defaults otherwise (1 controller thread, 20 QPS, burst 30),
    as its own manifests deploy it. Its webhook certificates live in a Secret that a kubelet
    would mount into /tmp/k8s-webhook-server/serving-certs; here the benchmark copies it."""

    kind = KUBEFLOW

    @staticmethod
    def version() -> str:
        return KUBEFLOW_VERSION

    def argv(self) -> list[str]:
        return [
            str(self.bin_dir / f"training-operator-{KUBEFLOW_VERSION}"),
            "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{procs.free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{procs.free_port()}",
            f"--webhook-server-port={procs.free_port()}",
            "--zap-log-level=info",
        ]

    def env(self) -> dict[str, str]:
        return dict(super().env(), MY_POD_NAMESPACE=KUBEFLOW_NS)

    @staticmethod
    def install(api: client.ApiClient) -> None:
        crd_file = kubeflow_module_dir() / "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
        apply_crd(api, yaml.safe_load(crd_file.read_text()))
        create_namespace(api, KUBEFLOW_NS)
        core = client.CoreV1Api(api)
        try:
            core.create_namespaced_secret(
                KUBEFLOW_NS,
                client.V1Secret(
                    metadata=client.V1ObjectMeta(name="training-operator-webhook-cert")
                ),
            )
        except ApiException as e:
            if e.status != 409:
                raise
        # No webhooks in it: nothing calls the operator's webhook server (validation off),
        # but its certificate rotator waits to inject the CA into this object.
        vwc = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "validator.training-operator.kubeflow.org"},
        }
        try:
            create_raw(api, "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                       vwc)  # fmt: skip
        except ApiException as e:
            if e.status != 409:
                raise

    def start(self) -> None:
        api = api_client(self.cluster.kubeconfig, pool=2)
        core = client.CoreV1Api(api)
        stop = threading.Event()

        def mount() -> None:  # the kubelet's job: the Secret's files into the cert dir
            while not stop.is_set():
                data = core.read_namespaced_secret(
                    "training-operator-webhook-cert", KUBEFLOW_NS
                ).data
                if data and "tls.crt" in data and "tls.key" in data:
                    import base64

                    KUBEFLOW_CERT_DIR.mkdir(parents=True, exist_ok=True)
                    for key in ("tls.crt", "tls.key"):
                        (KUBEFLOW_CERT_DIR / key).write_bytes(base64.b64decode(data[key]))
                    return
                time.sleep(0.2)

        t = threading.Thread(target=mount, daemon=True)
        t.start()
        try:
            super().start()
        finally:
            stop.set()
            api.close()

    def ready(self) -> bool:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return False
        return any(
            "Starting workers" in line and "pytorchjob" in line for line in text.splitlines()
        )


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


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback only
        return r.read().decode()
