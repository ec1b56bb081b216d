"""Kueue for the tests: its CRDs, its manager as a host process, and its webhooks, on the local
cluster or on any cluster whose API server can reach this host (kind's, from its Docker
network).

The manager (`kueue-<version>`, built by `cluster/build.sh kueue`) runs on the host like the
local cluster's components, with a kubeconfig and a config file. Its CRDs and webhook
configurations are read from the Go module cache
(`sigs.k8s.io/kueue@<version>/config/components`), never copied into this repository.

Webhook serving: a CA made for the manager (localkube.pki), a certificate for the address the
API server reaches this host on (127.0.0.1 where the API server runs here; on another cluster
the address this host uses towards its nodes, see `webhook_address`), and webhook
configurations that call `https://<that address>:<port>/<path>` with that CA. Kueue's
internal cert management is off: it writes its certificate into a Secret and injects the CA
into webhook configurations that name a Service (`kueue-webhook-service`), which reaches the
manager only as a pod behind that Service; here there is neither. Only the webhooks of
Kueue's own API group are installed: the manager runs no job integration (the operator creates
its Workloads itself), so a pod or Job webhook would only put every pod create in the cluster
behind a process that tests start and stop.

CRD conversion webhooks are left out too: everything here speaks kueue.x-k8s.io/v1beta2, the
storage version, so no conversion is ever asked for.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localkube import gomod, pki, procs

MODULE = "sigs.k8s.io/kueue"
VERSION = os.environ.get("KUEUE_VERSION", "v0.17.0")
GROUP = "kueue.x-k8s.io"
NAMESPACE = "kueue-system"
# Kueue's webhook configurations, renamed so that they are recognisably the local cluster's.
WEBHOOK_PREFIX = "localkube-kueue-"


def module_dir(version: str = VERSION) -> Path:
    return gomod.module_dir(MODULE, version)


def binary(bin_dir: Path, version: str = VERSION) -> Path:
    return bin_dir / f"kueue-{version}"


def crds(mod: Path) -> list[dict[str, Any]]:
    """Kueue's CRDs, as its release installs them (less the conversion webhooks)."""
    bases = sorted((mod / "config/components/crd/bases").glob("*.yaml"))
    return [yaml.safe_load(p.read_text()) for p in bases]


def _docs(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            yield doc


def webhook_configurations(mod: Path, host: str, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations for its own API group, calling the manager on this host
    at `host`:`port` instead of through a Service."""
    import base64

    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in _docs(mod / "config/components/webhook/manifests.yaml"):
        hooks = []
        for hook in doc.get("webhooks") or []:
            groups = {g for r in hook.get("rules") or [] for g in r.get("apiGroups") or []}
            if groups != {GROUP}:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook = {**hook, "clientConfig": {"url": f"https://{host}:{port}{path}"}}
            hook["clientConfig"]["caBundle"] = bundle
            hooks.append(hook)
        name = WEBHOOK_PREFIX + doc["metadata"]["name"]
        out.append({**doc, "metadata": {"name": name}, "webhooks": hooks})
    return out


@dataclass(frozen=True)
class KueuePorts:
    webhook: int
    health: int
    metrics: int


def render_config(
    ports: KueuePorts, cert_dir: Path, external_frameworks: list[str], webhook_host: str
) -> str:
    """The manager's Configuration: no leader election (one manager); the operator's jobs
    named as an external framework (Kind.version.group) so that Kueue knows who owns their
    Workloads (an empty `frameworks` is defaulted to batch/job, whose webhooks are not
    installed); webhook certificates from cert_dir, for the webhooks and the metrics server."""
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.metrics}"},
        "webhook": {"port": ports.webhook, "host": webhook_host, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": [], "externalFrameworks": list(external_frameworks)},
        # Its aggregated API server (pending workloads) binds a fixed port, which two clusters
        # on one host would share; it is not needed here.
        "featureGates": {"VisibilityOnDemand": False},
    }
    return yaml.safe_dump(config, sort_keys=False)


# Without internal cert management, Kueue's manager reads its metrics server's certificate
# from this fixed path (cmd/kueue/main.go), nothing else will do.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


def manager_argv(cert_dir: Path, argv: list[str]) -> list[str]:
    """`argv` in a mount namespace of its own where cert_dir is seen at METRICS_CERT_DIR: each
    cluster's manager gets its own certificate there, and the host's directory stays empty.
    unshare and sh exec, so the manager keeps the pid that was started."""
    script = 'mount --bind "$0" "$1" && shift && exec "$@"'
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(cert_dir),
        str(METRICS_CERT_DIR),
        *argv,
    ]


def write_serving_cert(cert_dir: Path, host: str) -> bytes:
    """tls.crt and tls.key (controller-runtime's names) for `host`, from a CA made for this
    manager alone; returns that CA's certificate (the webhooks' caBundle)."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    ca = pki.make_ca("localkube-kueue-webhook-ca")
    kc = pki.make_serving_cert(ca, "kueue-webhook", ["localhost"], [host])
    (cert_dir / "tls.crt").write_bytes(kc.cert_pem)
    key = cert_dir / "tls.key"
    key.write_bytes(kc.key_pem)
    key.chmod(0o600)
    return ca.cert_pem


def route_source(ip: str) -> str:
    """The address this host sends from towards `ip` (`ip route get`)."""
    out = subprocess.run(
        ["ip", "-j", "route", "get", ip], capture_output=True, text=True, check=True
    ).stdout
    src: str = json.loads(out)[0]["prefsrc"]
    return src


def webhook_address(api: Any) -> str:
    """Where the cluster's API server reaches a server on this host: 127.0.0.1 when a node is
    this host's own address or a loopback one (the local cluster, whose API server runs
    here), else the address this host uses towards the first node (kind: this host's address
    on the Docker network its node containers share)."""
    from kubernetes import client

    nodes = client.CoreV1Api(api).list_node().items
    return address_for_nodes(
        [
            a.address
            for n in nodes
            for a in (n.status.addresses if n.status else None) or []
            if a.type == "InternalIP"
        ]
    )


def address_for_nodes(ips: list[str]) -> str:
    """webhook_address's choice, from the nodes' InternalIPs."""
    if not ips:
        raise RuntimeError("no node has an InternalIP: cannot tell where the API server runs")
    src = route_source(ips[0])
    return "127.0.0.1" if src == ips[0] or ipaddress.ip_address(src).is_loopback else src


class Kueue:
    """Installs Kueue's CRDs, runs its manager and installs its webhooks; stop() undoes the
    latter two (CRDs and Kueue's objects stay, as after an upgrade)."""

    def __init__(
        self,
        cluster: Any,
        dir: Path,
        external_frameworks: list[str],
        version: str = VERSION,
    ) -> None:
        self.cluster = cluster
        self.dir = Path(dir)
        self.version = version
        self.external_frameworks = external_frameworks
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports = KueuePorts(*procs.free_ports(3))

    @property
    def log(self) -> Path:
        return self.dir / "kueue.log"

    def start(self, timeout: float = 120.0) -> Kueue:
        from kubernetes import client

        mod = module_dir(self.version)
        exe = binary(self.cluster.bin_dir, self.version)
        if not exe.exists():
            raise FileNotFoundError(f"{exe} missing: run cluster/build.sh kueue")
        api = self.cluster.api_client()
        try:
            self._install_crds(client.ApiextensionsV1Api(api), crds(mod), timeout)
            self._namespace(client.CoreV1Api(api))
            host = webhook_address(api)
            cert_dir = self.dir / "certs"
            ca = write_serving_cert(cert_dir, host)
            config = self.dir / "config.yaml"
            config.write_text(render_config(self.ports, cert_dir, self.external_frameworks, host))
            kubeconfig = self._manager_kubeconfig()
            METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)  # the mount point, left empty
            argv = [str(exe), f"--config={config}", "--zap-log-level=2"]
            self.proc = procs.start(
                manager_argv(cert_dir, argv),
                self.log,
                env={**os.environ, "KUBECONFIG": str(kubeconfig)},
                die_with_parent=True,
            )
            ready = f"http://127.0.0.1:{self.ports.health}/readyz"
            procs.wait_until("kueue", lambda: procs.http_ok(ready), self.proc, self.log, timeout)
            reg = client.AdmissionregistrationV1Api(api)
            for conf in webhook_configurations(mod, host, self.ports.webhook, ca):
                self._apply_webhook(reg, conf)
            # The webhooks answer once a ResourceFlavor can be created (dry run) through them.
            custom = client.CustomObjectsApi(api)
            procs.wait_until(
                "kueue webhook", lambda: _webhook_answers(custom), self.proc, self.log, timeout
            )
        finally:
            api.close()
        return self

    def stop(self) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api = self.cluster.api_client()
        try:
            reg = client.AdmissionregistrationV1Api(api)
            for delete in (
                reg.delete_mutating_webhook_configuration,
                reg.delete_validating_webhook_configuration,
            ):
                for kind in ("mutating", "validating"):
                    try:
                        delete(f"{WEBHOOK_PREFIX}{kind}-webhook-configuration")
                    except ApiException as e:
                        if e.status != 404:
                            raise
        finally:
            api.close()
        if self.proc is not None:
            procs.stop(self.proc.pid)
            self.proc = None

    def _manager_kubeconfig(self) -> Path:
        """A user of its own in system:masters on the local cluster; elsewhere the cluster's
        kubeconfig (the tests' own, an administrator's on kind)."""
        mint = getattr(self.cluster, "mint_kubeconfig", None)
        if mint is None:
            return Path(self.cluster.kubeconfig)
        path: Path = mint("kueue-manager", ["system:masters"])
        return path

    @staticmethod
    def _install_crds(ext: Any, docs: list[dict[str, Any]], timeout: float) -> None:
        from kubernetes.client.exceptions import ApiException

        for crd in docs:
            name = crd["metadata"]["name"]
            try:
                current = ext.read_custom_resource_definition(name)
                crd["metadata"]["resourceVersion"] = current.metadata.resource_version
                ext.replace_custom_resource_definition(name, crd)
            except ApiException as e:
                if e.status != 404:
                    raise
                ext.create_custom_resource_definition(crd)
        deadline = time.monotonic() + timeout
        for crd in docs:
            name = crd["metadata"]["name"]
            while True:
                conds = ext.read_custom_resource_definition(name).status.conditions or []
                if any(c.type == "Established" and c.status == "True" for c in conds):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not established")
                time.sleep(0.2)

    @staticmethod
    def _namespace(core: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        except ApiException as e:
            if e.status != 409:
                raise

    @staticmethod
    def _apply_webhook(reg: Any, conf: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        mutating = conf["kind"] == "MutatingWebhookConfiguration"
        create = (
            reg.create_mutating_webhook_configuration
            if mutating
            else reg.create_validating_webhook_configuration
        )
        delete = (
            reg.delete_mutating_webhook_configuration
            if mutating
            else reg.delete_validating_webhook_configuration
        )
        try:
            delete(conf["metadata"]["name"])
        except ApiException as e:
            if e.status != 404:
                raise
        create(conf)


def _webhook_answers(custom: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    flavor = {
        "apiVersion": f"{GROUP}/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "localkube-webhook-probe"},
    }
    try:
        custom.create_cluster_custom_object(
            GROUP, "v1beta2", "resourceflavors", flavor, dry_run="All"
        )
    except ApiException:
        return False
    return True
