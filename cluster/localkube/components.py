"""Command lines and config files of the control-plane components. Pure: paths and ports in,
argv lists and file contents out, so the flags are reviewed and unit-tested in one place."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .node.options import NodeOptions

SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
CLUSTER_DOMAIN = "cluster.local"
# The node lifecycle controller marks a silent node NotReady after this; the test for a lost
# node waits on it, so it is short (upstream default: 50s).
NODE_MONITOR_GRACE = "20s"
# Tolerations that DefaultTolerationSeconds admission adds to every pod: a lost node's pods are
# evicted this long after the node turns NotReady (upstream default: 300).
DEFAULT_TOLERATION_SECONDS = 30
# Kubernetes' own gang scheduling (docs/scheduling.md): the Workload and PodGroup API
# (scheduling.k8s.io/v1beta1, beta and off by default in 1.37) and kube-scheduler's
# GangScheduling plugin, both behind the GenericWorkload feature gate. Older releases had
# other, alpha versions of the API, which the operator does not use: the gate is set from
# 1.37 on only (an unknown gate stops a component).
WORKLOAD_MIN_MINOR = 37
WORKLOAD_GATES = "GenericWorkload=true"
WORKLOAD_RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"


def parse_minor(version: str) -> int | None:
    """1.<minor> from "Kubernetes v1.37.2" (what the components print for --version)."""
    match = re.search(r"v1\.(\d+)\.", version)
    return int(match.group(1)) if match else None


def workload_flags(minor: int | None, api: bool = False) -> list[str]:
    """The feature gate (and for the apiserver the API version) of the Workload API, for
    components of Kubernetes 1.<minor>; none before 1.37 or when the version is unknown."""
    if minor is None or minor < WORKLOAD_MIN_MINOR:
        return []
    flags = [f"--feature-gates={WORKLOAD_GATES}"]
    if api:
        flags.append(f"--runtime-config={WORKLOAD_RUNTIME_CONFIG}")
    return flags


@dataclass(frozen=True)
class NodeSpec:
    """One node that the process node registers. `to_json` is its --nodes-json entry."""

    name: str
    cpu: str = "8"
    memory: str = "32Gi"
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    # The node's clock, this many seconds ahead of the host's (negative: behind): the times
    # it writes into pod and node status (localkube.node.nodes).
    clock_skew_seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name,
            "cpu": self.cpu,
            "memory": self.memory,
            "gpus": self.gpus,
            "labels": dict(self.labels),
            "taints": list(self.taints),
        }
        if self.clock_skew_seconds:
            out["clockSkewSeconds"] = self.clock_skew_seconds
        return out


def default_nodes(
    count: int, cpu: str = "8", memory: str = "32Gi", gpus: int = 0
) -> list[NodeSpec]:
    return [NodeSpec(f"node-{i}", cpu=cpu, memory=memory, gpus=gpus) for i in range(count)]


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    dns_health: int
    dns_ready: int


@dataclass(frozen=True)
class Layout:
    """Where one cluster keeps its files, under its directory."""

    dir: Path

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.dir / "etcd"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def kubeconfigs(self) -> Path:
        return self.dir / "kubeconfigs"

    @property
    def corefile(self) -> Path:
        return self.dir / "Corefile"

    @property
    def node_state(self) -> Path:
        return self.dir / "node"

    @property
    def pids(self) -> Path:
        return self.dir / "pids.json"

    @property
    def state(self) -> Path:
        return self.dir / "state.json"

    @property
    def certs(self) -> Path:
        return self.dir / "serving-certs"


def etcd_args(bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=localkube",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        # Peer URLs must be set even for one member: the default :2380 clashes between
        # clusters, and a changed advertise URL must match --initial-cluster.
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=localkube={peer}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver_args(
    bin_dir: Path,
    layout: Layout,
    ports: Ports,
    host_ip: str,
    extra: list[str] | None = None,
    minor: int | None = None,
) -> list[str]:
    pki = layout.pki
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        # Every address, so pods on the bridge reach it; the advertised one is the bridge IP.
        "--bind-address=0.0.0.0",
        f"--advertise-address={host_ip}",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # No kube-proxy and no real node addresses: the reconciler would publish the bridge IP
        # as the `kubernetes` endpoint and fight nobody; off like kwokctl.
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        f"--default-not-ready-toleration-seconds={DEFAULT_TOLERATION_SECONDS}",
        f"--default-unreachable-toleration-seconds={DEFAULT_TOLERATION_SECONDS}",
        f"--cert-dir={layout.certs / 'apiserver'}",
        "--v=1",
        *workload_flags(minor, api=True),
        *(extra or []),
    ]


def controller_manager_args(
    bin_dir: Path, layout: Layout, ports: Ports, minor: int | None = None
) -> list[str]:
    pki = layout.pki
    kc = str(layout.admin_kubeconfig)
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        f"--cert-dir={layout.certs / 'controller-manager'}",
        "--leader-elect=false",
        "--controllers=*",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--use-service-account-credentials=false",
        f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
        "--node-monitor-period=2s",
        "--v=1",
        *workload_flags(minor),
    ]


def scheduler_args(
    bin_dir: Path, layout: Layout, ports: Ports, minor: int | None = None
) -> list[str]:
    kc = str(layout.admin_kubeconfig)
    return [
        str(bin_dir / "kube-scheduler"),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        f"--cert-dir={layout.certs / 'scheduler'}",
        "--leader-elect=false",
        "--v=1",
        *workload_flags(minor),
    ]


def render_corefile(host_ip: str, kubeconfig: Path, ports: Ports, ttl: int = 5) -> str:
    """Cluster DNS only. No `forward`: there is no outside network to forward to. No `cache`:
    the launcher polls for names that appear later, and a cached NXDOMAIN would hide them."""
    return f"""\
.:53 {{
    bind {host_ip}
    errors
    health 127.0.0.1:{ports.dns_health}
    ready 127.0.0.1:{ports.dns_ready}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl {ttl}
    }}
    loadbalance
}}
"""


def coredns_args(bin_dir: Path, layout: Layout) -> list[str]:
    return [str(bin_dir / "coredns"), "-conf", str(layout.corefile)]


def node_args(
    python: str,
    layout: Layout,
    nodes: list[NodeSpec],
    host_ip: str,
    base: int,
    api_port: int,
    bridge: str,
) -> list[str]:
    options = NodeOptions(
        kubeconfig=str(layout.admin_kubeconfig),
        state_dir=layout.node_state,
        nodes_json=json.dumps([n.to_json() for n in nodes], separators=(",", ":")),
        dns_ip=host_ip,
        pod_cidr_base=base,
        api_host=host_ip,
        api_port=api_port,
        ca_file=str(layout.pki / "ca.crt"),
        bridge=bridge,
        serving_cert=str(layout.pki / "node.crt"),
        serving_key=str(layout.pki / "node.key"),
    )
    return [python, "-m", "localkube.node", *options.argv()]
