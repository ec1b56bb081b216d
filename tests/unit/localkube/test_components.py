"""Flags and config files of the control-plane components."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from localkube import components
from localkube.components import Layout, NodeSpec, Ports
from localkube.node.options import NodeOptions

BIN = Path("/bin-dir")
LAYOUT = Layout(Path("/c"))
PORTS = Ports(
    etcd_client=2001,
    etcd_peer=2002,
    apiserver=6443,
    controller_manager=10257,
    scheduler=10259,
    dns_health=8080,
    dns_ready=8181,
)


def _flags(argv: list[str]) -> dict[str, str]:
    out = {}
    for a in argv[1:]:
        assert a.startswith("--"), a
        key, _, value = a[2:].partition("=")
        assert key not in out, f"--{key} given twice"
        out[key] = value
    return out


def test_etcd_listens_on_loopback_ports_only_and_skips_fsync() -> None:
    argv = components.etcd_args(BIN, LAYOUT, PORTS)
    assert argv[0] == "/bin-dir/etcd"
    f = _flags(argv)
    assert f["listen-client-urls"] == "http://127.0.0.1:2001"
    assert f["listen-peer-urls"] == "http://127.0.0.1:2002"
    assert f["initial-cluster"] == "localkube=http://127.0.0.1:2002"
    assert f["unsafe-no-fsync"] == "true"
    assert f["data-dir"] == "/c/etcd"


def test_apiserver_flags() -> None:
    f = _flags(components.apiserver_args(BIN, LAYOUT, PORTS, "10.244.0.1"))
    assert f["etcd-servers"] == "http://127.0.0.1:2001"
    assert f["bind-address"] == "0.0.0.0"
    assert f["advertise-address"] == "10.244.0.1"
    assert f["secure-port"] == "6443"
    assert f["client-ca-file"] == "/c/pki/ca.crt"
    assert f["authorization-mode"] == "Node,RBAC"
    assert f["service-account-issuer"] == "https://kubernetes.default.svc.cluster.local"
    assert f["service-account-key-file"] == "/c/pki/sa.pub"
    assert f["service-account-signing-key-file"] == "/c/pki/sa.key"
    assert f["service-cluster-ip-range"] == "10.96.0.0/16"
    assert f["endpoint-reconciler-type"] == "none"
    assert f["allow-privileged"] == "true"
    # default admission plugins stay on (ServiceAccount, DefaultTolerationSeconds, ...)
    assert "admission-control" not in f
    assert "disable-admission-plugins" not in f
    assert int(f["default-unreachable-toleration-seconds"]) <= 60


def test_apiserver_extra_flags_come_last() -> None:
    argv = components.apiserver_args(BIN, LAYOUT, PORTS, "10.244.0.1", ["--v=4"])
    assert argv[-1] == "--v=4"


def test_controller_manager_runs_every_controller_with_sa_keys_and_fast_node_monitor() -> None:
    f = _flags(components.controller_manager_args(BIN, LAYOUT, PORTS))
    assert f["controllers"] == "*"
    assert f["leader-elect"] == "false"
    assert f["kubeconfig"] == "/c/admin.kubeconfig"
    assert f["service-account-private-key-file"] == "/c/pki/sa.key"
    assert f["root-ca-file"] == "/c/pki/ca.crt"
    assert f["use-service-account-credentials"] == "false"
    assert f["bind-address"] == "127.0.0.1"
    assert f["secure-port"] == "10257"
    assert f["node-monitor-grace-period"].endswith("s")
    assert int(f["node-monitor-grace-period"][:-1]) <= 30


def test_scheduler_flags() -> None:
    f = _flags(components.scheduler_args(BIN, LAYOUT, PORTS))
    assert f["leader-elect"] == "false"
    assert f["kubeconfig"] == "/c/admin.kubeconfig"
    assert (f["bind-address"], f["secure-port"]) == ("127.0.0.1", "10259")


def test_corefile_serves_cluster_zone_on_bridge_without_forward_or_cache() -> None:
    text = components.render_corefile("10.244.0.1", Path("/c/admin.kubeconfig"), PORTS)
    lines = [ln.strip() for ln in text.splitlines()]
    assert "bind 10.244.0.1" in lines
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa {" in lines
    assert "kubeconfig /c/admin.kubeconfig" in lines
    assert "pods insecure" in lines
    assert "ttl 5" in lines
    assert "health 127.0.0.1:8080" in lines
    assert "ready 127.0.0.1:8181" in lines
    assert not any(ln.startswith(("forward", "cache", "proxy")) for ln in lines)
    assert text.count("{") == text.count("}")


def test_node_args_pass_nodes_as_json_and_the_network() -> None:
    nodes = [
        NodeSpec("node-0"),
        NodeSpec("gpu-0", cpu="16", memory="64Gi", gpus=2, labels={"a": "b"}),
    ]
    argv = components.node_args("/py", LAYOUT, nodes, "10.244.0.1", 244, 6443, "lk-x")
    assert argv[:3] == ["/py", "-m", "localkube.node"]
    opts = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert json.loads(opts["--nodes-json"]) == [
        {"name": "node-0", "cpu": "8", "memory": "32Gi", "gpus": 0, "labels": {}, "taints": []},
        {
            "name": "gpu-0",
            "cpu": "16",
            "memory": "64Gi",
            "gpus": 2,
            "labels": {"a": "b"},
            "taints": [],
        },
    ]
    assert opts["--kubeconfig"] == "/c/admin.kubeconfig"
    assert opts["--state-dir"] == "/c/node"
    assert opts["--dns-ip"] == opts["--api-host"] == "10.244.0.1"
    assert opts["--pod-cidr-base"] == "244"
    assert opts["--api-port"] == "6443"
    assert opts["--ca-file"] == "/c/pki/ca.crt"
    assert opts["--bridge"] == "lk-x"


@pytest.mark.parametrize("count", [0, 1, 3])
def test_default_nodes_are_named_by_index(count: int) -> None:
    nodes = components.default_nodes(count, cpu="4", memory="8Gi", gpus=1)
    assert [n.name for n in nodes] == [f"node-{i}" for i in range(count)]
    assert all((n.cpu, n.memory, n.gpus) == ("4", "8Gi", 1) for n in nodes)


def test_workload_api_and_gang_scheduling_are_on_from_kubernetes_1_37() -> None:
    api = _flags(components.apiserver_args(BIN, LAYOUT, PORTS, "10.244.0.1", minor=37))
    assert api["feature-gates"] == "GenericWorkload=true"
    assert api["runtime-config"] == "scheduling.k8s.io/v1beta1=true"
    for argv in (
        components.scheduler_args(BIN, LAYOUT, PORTS, minor=37),
        components.controller_manager_args(BIN, LAYOUT, PORTS, minor=38),
    ):
        assert _flags(argv)["feature-gates"] == "GenericWorkload=true"


@pytest.mark.parametrize("minor", [None, 34, 36])
def test_no_workload_gate_before_1_37_where_the_gate_or_api_version_differs(
    minor: int | None,
) -> None:
    for argv in (
        components.apiserver_args(BIN, LAYOUT, PORTS, "10.244.0.1", minor=minor),
        components.scheduler_args(BIN, LAYOUT, PORTS, minor=minor),
        components.controller_manager_args(BIN, LAYOUT, PORTS, minor=minor),
    ):
        flags = _flags(argv)
        assert "feature-gates" not in flags
        assert "runtime-config" not in flags


@pytest.mark.parametrize(
    ("text", "minor"),
    [("Kubernetes v1.37.2\n", 37), ("Kubernetes v1.34.4", 34), ("garbage", None)],
)
def test_parse_minor(text: str, minor: int | None) -> None:
    assert components.parse_minor(text) == minor


def test_the_node_reads_what_the_control_plane_writes() -> None:
    argv = components.node_args(
        "/py", LAYOUT, [NodeSpec("node-0")], "10.244.0.1", 244, 6443, "lk-x"
    )
    options = NodeOptions.parse(argv[3:])
    assert options.state_dir == Path("/c/node") and options.api_port == 6443
    assert options.pod_cidr_base == 244 and options.backoff_base == 10.0
    assert options.argv() == argv[3:]
    quick = dataclasses.replace(options, backoff_base=0.5, log_level="DEBUG")
    assert NodeOptions.parse(quick.argv()) == quick
