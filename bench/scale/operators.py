"""The operators as local processes, started fresh for every run: ours and Kubeflow's
training-operator (Trainer v2 + JobSet: trainer.py), with their CPU and peak RSS from /proc
and, for ours, an optional py-spy profile."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube import gomod, procs
from localkube.controlplane import Cluster
from localkube.testing import create_namespace
from prometheus_client.parser import text_string_to_metric_families

from .harness import REPO, USERS, BenchError, api_client, apply_crd, create_raw, wait
from .workloads import KUBEFLOW, OURS

KUBEFLOW_MODULE = "github.com/kubeflow/training-operator"
KUBEFLOW_VERSION = os.environ.get("TRAINING_OPERATOR_VERSION", "v1.9.3")
KUBEFLOW_NS = "kubeflow"
KUBEFLOW_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # fixed in its pkg/cert
CLK_TCK = os.sysconf("SC_CLK_TCK")
# py-spy's sampling rate (Hz) for --profile: enough samples in a one-minute run, and light
# enough (it reads the process's memory from outside) not to slow the operator it measures.
PROFILE_RATE = 97


def kubeflow_module_dir() -> Path:
    """The training-operator module in the Go module cache (cluster/build.sh put it there)."""
    try:
        return gomod.module_dir(KUBEFLOW_MODULE, KUBEFLOW_VERSION)
    except RuntimeError as e:
        raise BenchError(str(e)) from e


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
    # Flags for the next start: the client limits of the run's setting (limits.flags).
    extra_args: list[str] = []

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
            "--workers", str(self.workers), *self.extra_args,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), env.get("PYTHONPATH", "")])
        return env

    def ready(self) -> bool:
        return procs.http_ok(f"http://127.0.0.1:{self.port}/metrics")

    def rate_limit_wait(self) -> tuple[float, int] | None:
        """From the operator's own metrics: the seconds its API requests waited on its client
        rate limit (--kube-api-qps/--kube-api-burst), summed, and how many requests passed it;
        None if the metrics cannot be read."""
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
        except (OSError, ValueError):
            return None
        return parse_rate_limit_wait(text)


RATE_LIMIT_METRIC = "torchrun_operator_client_rate_limit_wait_seconds"


def parse_rate_limit_wait(text: str) -> tuple[float, int] | None:
    """The rate-limit histogram's sum and count from a Prometheus text exposition."""
    got = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        if family.name == RATE_LIMIT_METRIC
        for s in family.samples
        if s.name in (f"{RATE_LIMIT_METRIC}_sum", f"{RATE_LIMIT_METRIC}_count")
    }
    if len(got) < 2:
        return None
    return got[f"{RATE_LIMIT_METRIC}_sum"], int(got[f"{RATE_LIMIT_METRIC}_count"])


class Kubeflow(OperatorProc):
    """training-operator v1 as a local process: PyTorchJob only, gang scheduling off (no
    --gang-scheduler-name), its defaults otherwise (1 controller thread, 20 QPS, burst 30),
    as its own manifests deploy it, unless extra_args raise them. Its webhook certificates
    live in a Secret that a kubelet would mount into /tmp/k8s-webhook-server/serving-certs;
    here the benchmark copies it."""

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
            *self.extra_args,
        ]

    def env(self) -> dict[str, str]:
        # Its certificate rotator looks in the fixed KUBEFLOW_CERT_DIR, but its webhook server
        # reads $TMPDIR/k8s-webhook-server/serving-certs: with TMPDIR set elsewhere it exits
        # ("open .../tls.crt: no such file or directory").
        return dict(
            super().env(), MY_POD_NAMESPACE=KUBEFLOW_NS, TMPDIR=str(KUBEFLOW_CERT_DIR.parents[1])
        )

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

        # Its rotator calls the certificates mounted as soon as tls.crt exists, and its webhook
        # server then reads both files once, at start. So a previous run's files go first (else
        # it starts on them while this run's are being written), the key lands before the
        # certificate, and each file appears whole, by rename: an empty or half-written tls.crt
        # made it exit with "tls: failed to find any PEM data in certificate input".
        KUBEFLOW_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            (KUBEFLOW_CERT_DIR / name).unlink(missing_ok=True)

        def mount() -> None:  # the kubelet's job: the Secret's files into the cert dir
            while not stop.is_set():
                data = core.read_namespaced_secret(
                    "training-operator-webhook-cert", KUBEFLOW_NS
                ).data
                if data and "tls.crt" in data and "tls.key" in data:
                    for name in ("tls.key", "tls.crt"):
                        part = KUBEFLOW_CERT_DIR / f".{name}.part"
                        part.write_bytes(base64.b64decode(data[name]))
                        os.replace(part, KUBEFLOW_CERT_DIR / name)
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
