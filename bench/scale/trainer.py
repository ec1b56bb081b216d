"""Kubeflow Trainer v2 and JobSet as the benchmark's third comparison: both controllers as
local processes (`trainer-controller-manager-<version>` and `jobset-<version>`, built by
`cluster/build.sh all` from their Go modules), with what they need read from the Go module
cache, never copied into this repository:

- Trainer's CRDs: `github.com/kubeflow/trainer/v2@<v>/manifests/base/crds/*.yaml`;
- JobSet's CRD: `sigs.k8s.io/jobset@<v>/config/components/crd/bases/*.yaml` (its conversion
  webhook patch left out: the CRD has one version, so nothing is ever converted);
- the torch ClusterTrainingRuntime: Trainer's `manifests/base/runtimes/torch_distributed.yaml`,
  with a restart policy added (bench_runtime);
- the controllers' configurations: Trainer's `manifests/base/manager/
  controller_manager_config.yaml` and JobSet's `config/components/manager/
  controller_manager_config.yaml`, as their releases deploy them, with what running outside a
  cluster needs changed (trainer_config, jobset_config);
- the webhook configurations: Trainer's `manifests/base/webhook/` and JobSet's
  `config/components/webhook/` (`manifests.yaml` with their kustomizations' JSON patches).

Webhooks are served, not disabled: Trainer's defaulting and validation of TrainJobs and
JobSet's defaulting and validation of JobSets and of their pods are part of what they do for
every job. Their own certificate management is off: it writes a certificate for a Service
(`<service>.<namespace>.svc`) into a Secret that a kubelet would mount, and injects its CA into
the webhook configurations; here there is neither a Service nor a kubelet, and the apiserver
runs on the same host. So, as localkube.kueue does for Kueue: a serving certificate for
127.0.0.1 from the cluster's CA, and webhook configurations calling
`https://127.0.0.1:<port><path>` with that CA.
"""

from __future__ import annotations

import base64
import copy
import json
import os
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube import gomod, pki, procs
from localkube.controlplane import Cluster

from .harness import (
    JOBSET_USER,
    TRAINER_USER,
    BenchError,
    apply_crd,
    create_raw,
    raw,
    wait,
)
from .operators import OperatorProc
from .workloads import TRAINER, TRAINER_RUNTIME, Workload, trainer_job

TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
TRAINER_VERSION = os.environ.get("TRAINER_VERSION", "v2.3.0")
JOBSET_MODULE = "sigs.k8s.io/jobset"
JOBSET_VERSION = os.environ.get("JOBSET_VERSION", "v0.12.0")  # what Trainer's go.mod requires
RUNTIME_PATH = "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
MAX_RESTARTS = 3  # as our jobs' failurePolicy.maxRestarts
WEBHOOK_PREFIX = {TRAINER_MODULE: "bench-trainer-", JOBSET_MODULE: "bench-jobset-"}


def module_dir(module: str, version: str) -> Path:
    try:
        return gomod.module_dir(module, version)
    except RuntimeError as e:
        raise BenchError(str(e)) from e


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# ---- manifests (pure) -------------------------------------------------------------------------


def bench_runtime(runtime: dict[str, Any]) -> dict[str, Any]:
    """Trainer's torch ClusterTrainingRuntime with a gang restart policy, which it lacks (a
    failed pod would be retried by its Job alone, up to the Job's default backoffLimit of 6):
    the `node` Job fails on its first failed pod (`backoffLimit: 0`), and JobSet's failure
    policy then recreates every Job of the JobSet, up to MAX_RESTARTS times."""
    out = copy.deepcopy(runtime)
    jobset = out["spec"]["template"]["spec"]
    jobset["failurePolicy"] = {"maxRestarts": MAX_RESTARTS}
    for rjob in jobset["replicatedJobs"]:
        rjob["template"].setdefault("spec", {})["backoffLimit"] = 0
    return out


def json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add` and `replace` (what the modules' kustomizations use); anything else is
    refused, so a newer manifest that needs more fails here rather than installing wrongly."""
    out = copy.deepcopy(doc)
    for op in ops:
        if op.get("op") not in ("add", "replace"):
            raise ValueError(f"unsupported JSON patch op {op!r}")
        keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].lstrip("/").split("/")]
        target: Any = out
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target[k]
        last, value = keys[-1], copy.deepcopy(op["value"])
        if isinstance(target, list):
            if op["op"] == "add":
                target.insert(len(target) if last == "-" else int(last), value)
            else:
                target[int(last)] = value
        else:
            if op["op"] == "replace" and last not in target:
                raise ValueError(f"replace of a missing {op['path']}")
            target[last] = value
    return out


def kustomized_webhooks(webhook_dir: Path) -> list[dict[str, Any]]:
    """The webhook configurations as the module's kustomization renders them: its resources
    with its JSON patches (by target kind, and name where given) applied."""
    kust = yaml.safe_load((webhook_dir / "kustomization.yaml").read_text())
    docs = [d for r in kust.get("resources") or [] if r.endswith("manifests.yaml")
            for d in _docs(webhook_dir / r)]  # fmt: skip
    out = []
    for doc in docs:
        for patch in kust.get("patches") or []:
            target = patch.get("target") or {}
            if target.get("kind") != doc["kind"]:
                continue
            if target.get("name") not in (None, doc["metadata"]["name"]):
                continue
            doc = json_patch(doc, yaml.safe_load((webhook_dir / patch["path"]).read_text()))
        out.append(doc)
    return out


def local_webhooks(
    docs: list[dict[str, Any]], port: int, ca_pem: bytes, prefix: str
) -> list[dict[str, Any]]:
    """The configurations calling the controller on the host at 127.0.0.1:`port` instead of
    through a Service, trusting `ca_pem`; renamed with `prefix`."""
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in docs:
        hooks = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            url = f"https://127.0.0.1:{port}{path}"
            hooks.append({**hook, "clientConfig": {"url": url, "caBundle": bundle}})
        out.append({
            "apiVersion": doc["apiVersion"], "kind": doc["kind"],
            "metadata": {"name": prefix + doc["metadata"]["name"]}, "webhooks": hooks,
        })  # fmt: skip
    return out


def trainer_config(release: dict[str, Any], ports: dict[str, int]) -> dict[str, Any]:
    """Trainer's configuration as its release deploys it (client QPS 50 / burst 100, TrainJob
    concurrency 5, which v2.3.0 does not apply: see HOW in run.py), with only what a host
    process needs changed: its servers on 127.0.0.1 and free ports; no leader election (one
    process; electing needs a namespace, which out of a cluster it cannot find); no
    certificate management (see the module docstring). Its webhook certificate is read from
    controller-runtime's default directory, which follows TMPDIR (TrainerProc sets it)."""
    cfg = copy.deepcopy(release)
    cfg["health"] = {**cfg.get("health", {}),
                     "healthProbeBindAddress": f"127.0.0.1:{ports['health']}"}  # fmt: skip
    cfg["metrics"] = {**cfg.get("metrics", {}), "bindAddress": f"127.0.0.1:{ports['metrics']}"}
    cfg["webhook"] = {**cfg.get("webhook", {}), "port": ports["webhook"], "host": "127.0.0.1"}
    cfg["leaderElection"] = {**cfg.get("leaderElection", {}), "leaderElect": False}
    cfg["certManagement"] = {**cfg.get("certManagement", {}), "enable": False}
    return cfg


def jobset_config(release: dict[str, Any], ports: dict[str, int], cert_dir: Path) -> dict[str, Any]:
    """JobSet's configuration as its release deploys it (client QPS 500 / burst 500 by
    default), with the same changes as Trainer's; its webhook and metrics servers read their
    certificate from `cert_dir`."""
    cfg = copy.deepcopy(release)
    cfg["health"] = {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"}
    cfg["metrics"] = {"bindAddress": f"127.0.0.1:{ports['metrics']}", "certDir": str(cert_dir)}
    cfg["webhook"] = {"port": ports["webhook"], "host": "127.0.0.1", "certDir": str(cert_dir)}
    cfg["leaderElection"] = {**(cfg.get("leaderElection") or {}), "leaderElect": False}
    cfg["internalCertManagement"] = {"enable": False}
    return cfg


# ---- processes --------------------------------------------------------------------------------


def _ports() -> dict[str, int]:
    return dict(zip(("health", "metrics", "webhook"), procs.free_ports(3), strict=True))


def write_serving_cert(cluster: Cluster, cert_dir: Path) -> None:
    """tls.crt and tls.key (controller-runtime's names) for 127.0.0.1, from the cluster CA."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    kc = pki.make_serving_cert(pki.load_ca(cluster.pki), "bench-webhook", ["localhost"],
                               ["127.0.0.1"])  # fmt: skip
    (cert_dir / "tls.crt").write_bytes(kc.cert_pem)
    key = cert_dir / "tls.key"
    key.write_bytes(kc.key_pem)
    key.chmod(0o600)


class _Controller(OperatorProc):
    """One of the two processes; ports are fixed for its life (the webhook configurations
    name them)."""

    kind = TRAINER
    audit_user = ""

    def __init__(self, cluster: Cluster, workdir: Path, bin_dir: Path) -> None:
        super().__init__(cluster, workdir, bin_dir)
        self.ports = _ports()
        self.config = workdir / f"{self.name}-config.yaml"

    @property
    def user(self) -> str:
        return self.audit_user

    def ready(self) -> bool:
        return procs.http_ok(f"http://127.0.0.1:{self.ports['health']}/readyz")


class JobSetProc(_Controller):
    """Logging: production encoder at info, as training-operator runs here (JobSet's binary
    defaults to zap's development mode; both releases deploy with --zap-log-level=2)."""

    name = "jobset"
    audit_user = JOBSET_USER

    def write_config(self, mod: Path, cert_dir: Path) -> None:
        release = yaml.safe_load(
            (mod / "config/components/manager/controller_manager_config.yaml").read_text()
        )
        self.config.write_text(yaml.safe_dump(jobset_config(release, self.ports, cert_dir)))

    def argv(self) -> list[str]:
        return [str(self.bin_dir / f"jobset-{JOBSET_VERSION}"), f"--config={self.config}",
                "--zap-devel=false", "--zap-log-level=info"]  # fmt: skip


class TrainerProc(_Controller):
    name = "trainer"
    audit_user = TRAINER_USER

    def write_config(self, mod: Path) -> None:
        release = yaml.safe_load(
            (mod / "manifests/base/manager/controller_manager_config.yaml").read_text()
        )
        self.config.write_text(yaml.safe_dump(trainer_config(release, self.ports)))

    @property
    def tmpdir(self) -> Path:
        return self.workdir / "trainer-tmp"

    @property
    def cert_dir(self) -> Path:  # controller-runtime's default: $TMPDIR/k8s-webhook-server/...
        return self.tmpdir / "k8s-webhook-server" / "serving-certs"

    def argv(self) -> list[str]:
        return [str(self.bin_dir / f"trainer-controller-manager-{TRAINER_VERSION}"),
                f"--config={self.config}", "--zap-log-level=info"]  # fmt: skip

    def env(self) -> dict[str, str]:
        return dict(super().env(), TMPDIR=str(self.tmpdir))


class TrainerJobSet(OperatorProc):
    """Kubeflow Trainer v2's controller manager and the JobSet controller, started (JobSet
    first) and stopped together for every run; CPU, peak RSS and API requests are both
    processes' summed."""

    kind = TRAINER

    def __init__(self, cluster: Cluster, workdir: Path, bin_dir: Path) -> None:
        self.cluster, self.workdir, self.bin_dir = cluster, workdir, bin_dir
        self.jobset = JobSetProc(cluster, workdir, bin_dir)
        self.trainer = TrainerProc(cluster, workdir, bin_dir)
        self.parts: list[_Controller] = [self.jobset, self.trainer]
        self.probed = False

    @staticmethod
    def version() -> str:
        return f"Trainer {TRAINER_VERSION} + JobSet {JOBSET_VERSION}"

    @staticmethod
    def binaries(bin_dir: Path) -> list[Path]:
        return [bin_dir / f"trainer-controller-manager-{TRAINER_VERSION}",
                bin_dir / f"jobset-{JOBSET_VERSION}"]  # fmt: skip

    @property
    def user(self) -> str:
        return TRAINER_USER

    @property
    def users(self) -> list[str]:
        return [p.user for p in self.parts]

    def install(self, api: client.ApiClient) -> None:
        """CRDs, the runtime, the configurations, the certificate, then the webhook
        configurations (last: they refuse what they cover while the controllers are down)."""
        tmod = module_dir(TRAINER_MODULE, TRAINER_VERSION)
        jmod = module_dir(JOBSET_MODULE, JOBSET_VERSION)
        crds = sorted((jmod / "config/components/crd/bases").glob("*.yaml"))
        crds += sorted((tmod / "manifests/base/crds").glob("trainer.kubeflow.org_*.yaml"))
        for path in crds:
            apply_crd(api, yaml.safe_load(path.read_text()))
        runtime = yaml.safe_load((tmod / "manifests/base/runtimes/torch_distributed.yaml")
                                 .read_text())  # fmt: skip
        if runtime["metadata"]["name"] != TRAINER_RUNTIME:
            raise BenchError(f"{TRAINER_MODULE} {TRAINER_VERSION}: no {TRAINER_RUNTIME} runtime")
        try:
            create_raw(api, RUNTIME_PATH, bench_runtime(runtime))
        except ApiException as e:
            if e.status != 409:
                raise
        cert_dir = self.workdir / "jobset-certs"
        write_serving_cert(self.cluster, cert_dir)
        write_serving_cert(self.cluster, self.trainer.cert_dir)
        self.jobset.write_config(jmod, cert_dir)
        self.trainer.write_config(tmod)
        ca = self.cluster.pki.ca_cert.read_bytes()
        confs = local_webhooks(
            kustomized_webhooks(jmod / "config/components/webhook"),
            self.jobset.ports["webhook"],
            ca,
            WEBHOOK_PREFIX[JOBSET_MODULE],
        )
        confs += local_webhooks(
            kustomized_webhooks(tmod / "manifests/base/webhook"),
            self.trainer.ports["webhook"],
            ca,
            WEBHOOK_PREFIX[TRAINER_MODULE],
        )
        for conf in confs:
            plural = "mutating" if conf["kind"] == "MutatingWebhookConfiguration" else "validating"
            url = f"/apis/admissionregistration.k8s.io/v1/{plural}webhookconfigurations"
            try:
                create_raw(api, url, conf)
            except ApiException as e:
                if e.status != 409:
                    raise

    def start(self) -> None:
        for p in self.parts:
            p.start()
        if not self.probed:
            self._probe()
            self.probed = True

    def _probe(self) -> None:
        """Waits until the apiserver calls Trainer's defaulting webhook: a dry-run TrainJob
        comes back with its runtimePatches entry stamped (`time`), which only the webhook
        sets."""
        api = self.cluster.api_client()
        job = trainer_job(Workload("probe", 1, 1, 1), "webhook-probe")
        path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
        last = [""]

        def stamped() -> bool:
            try:
                resp = raw(api, "POST", path, query=[("dryRun", "All")], body=job)
            except ApiException as e:
                last[0] = str(e.reason)[:500]
                return False
            got = json.loads(resp.data)
            last[0] = "answered without a time stamp"
            return bool(got["spec"]["runtimePatches"][0].get("time"))

        try:
            wait("Trainer's webhooks answer", stamped, 60)
        except BenchError as e:
            raise BenchError(f"{e}: {last[0]}") from None
        finally:
            api.close()

    def usage(self) -> tuple[float, float]:
        """CPU seconds of both since their start; the sum of their peak RSS (each its own
        VmHWM: an upper bound of the two's peak together)."""
        cpu = rss = 0.0
        for p in self.parts:
            c, r = p.usage()
            cpu, rss = cpu + c, rss + r
        return cpu, rss

    def usage_by_process(self) -> dict[str, dict[str, float]]:
        out = {}
        for p in self.parts:
            c, r = p.usage()
            out[p.name] = {"cpu_s": round(c, 2), "peak_rss_mib": round(r, 1)}
        return out

    def stop(self) -> None:
        for p in reversed(self.parts):
            p.stop()
