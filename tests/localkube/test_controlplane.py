"""The control plane itself: API, RBAC, namespaces, EndpointSlices, cluster DNS, teardown."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from localkube import network, procs
from localkube.controlplane import Cluster, node_package_available
from localkube.testing import ExternalCluster, namespace_gone, pick_base, wait_for

# --- a tiny DNS client (RFC 1035), so the test needs no resolver library ---------------------


def _encode_name(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"


def _skip_name(data: bytes, off: int) -> int:
    while True:
        length = data[off]
        if length & 0xC0 == 0xC0:  # compression pointer: two bytes, ends the name
            return off + 2
        if length == 0:
            return off + 1
        off += 1 + length


def dns_query_a(server: str, name: str, timeout: float = 2.0) -> tuple[int, list[str]]:
    """(rcode, IPv4 addresses of the A records in the answer)."""
    qid = random.randrange(1 << 16)
    header = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)  # RD set, one question
    msg = header + _encode_name(name) + struct.pack("!HH", 1, 1)  # type A, class IN
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(msg, (server, 53))
        data, _ = s.recvfrom(4096)
    rid, flags, qdcount, ancount, _, _ = struct.unpack("!HHHHHH", data[:12])
    assert rid == qid, "answer to another query"
    off = 12
    for _ in range(qdcount):
        off = _skip_name(data, off) + 4
    addrs = []
    for _ in range(ancount):
        off = _skip_name(data, off)
        rtype, _cls, _ttl, rdlen = struct.unpack("!HHIH", data[off : off + 10])
        off += 10
        if rtype == 1 and rdlen == 4:
            addrs.append(socket.inet_ntoa(data[off : off + 4]))
        off += rdlen
    return flags & 0xF, addrs


# --- tests -----------------------------------------------------------------------------------


def test_version_answers(cluster: Cluster | ExternalCluster, kube: client.ApiClient) -> None:
    version = client.VersionApi(kube).get_code()
    if isinstance(cluster, Cluster):
        # cluster/build.sh's cache folder is named for what it built: k8s-<version>.etcd-...
        built = cluster.bin_dir.name.split(".etcd-")[0].removeprefix("k8s-")
        assert built.startswith("v1."), cluster.bin_dir
        assert version.git_version == built
    else:
        assert version.major == "1"


def _can_list_pods(kubeconfig: Path, namespace: str) -> bool:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        client.CoreV1Api(api).list_namespaced_pod(namespace)
        return True
    except ApiException as e:
        if e.status == 403:
            return False
        raise
    finally:
        api.close()


def _bind_view(kube: client.ApiClient, namespace: str, subject: client.RbacV1Subject) -> None:
    client.RbacAuthorizationV1Api(kube).create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="viewer"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="view"
            ),
            subjects=[subject],
        ),
    )


def test_rbac_denies_a_new_user_until_bound(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    kubeconfig = cluster.mint_kubeconfig("alice", ["developers"])
    assert not _can_list_pods(kubeconfig, namespace)
    _bind_view(kube, namespace, client.RbacV1Subject(kind="User", name="alice"))
    wait_for("alice may list pods", lambda: _can_list_pods(kubeconfig, namespace), 15)
    # The binding is for this namespace only.
    assert not _can_list_pods(kubeconfig, "default")


def test_rbac_group_from_client_certificate(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    kubeconfig = cluster.mint_kubeconfig("bob", ["auditors"])
    assert not _can_list_pods(kubeconfig, namespace)
    _bind_view(kube, namespace, client.RbacV1Subject(kind="Group", name="auditors"))
    wait_for("group auditors may list pods", lambda: _can_list_pods(kubeconfig, namespace), 15)


def test_rbac_service_account_token(
    cluster: Cluster | ExternalCluster, kube: client.ApiClient, namespace: str
) -> None:
    client.CoreV1Api(kube).create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="robot"))
    )
    kubeconfig = cluster.mint_service_account_kubeconfig(namespace, "robot")
    assert not _can_list_pods(kubeconfig, namespace)
    _bind_view(
        kube,
        namespace,
        client.RbacV1Subject(kind="ServiceAccount", name="robot", namespace=namespace),
    )
    wait_for("robot may list pods", lambda: _can_list_pods(kubeconfig, namespace), 15)


def test_namespace_with_objects_deletes(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    ns = f"deleteme-{random.randrange(16**6):06x}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    meta = client.V1ObjectMeta
    owner = core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=meta(name="owner"), data={"a": "1"})
    )
    assert owner.metadata is not None and owner.metadata.uid
    core.create_namespaced_config_map(
        ns,
        client.V1ConfigMap(
            metadata=meta(
                name="owned",
                owner_references=[
                    client.V1OwnerReference(
                        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
                    )
                ],
            )
        ),
    )
    core.create_namespaced_secret(ns, client.V1Secret(metadata=meta(name="s"), data={}))
    core.create_namespaced_service(
        ns,
        client.V1Service(
            metadata=meta(name="svc"),
            spec=client.V1ServiceSpec(selector={"app": "x"}, ports=[client.V1ServicePort(port=80)]),
        ),
    )
    core.delete_namespace(ns)
    wait_for(f"namespace {ns} to be deleted", lambda: namespace_gone(kube, ns), timeout=60)


def test_endpointslices_for_headless_service(kube: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    core.create_namespaced_service(
        namespace,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="job"),
            spec=client.V1ServiceSpec(
                cluster_ip="None",
                publish_not_ready_addresses=True,
                selector={"app": "job"},
                ports=[client.V1ServicePort(name="c10d", port=29400)],
            ),
        ),
    )
    # A pod that nobody runs: bound to a node name no kubelet serves, its IP written by hand,
    # so the test exercises only the controller, on any cluster.
    core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="job-0", labels={"app": "job"}),
            spec=client.V1PodSpec(
                hostname="job-0",
                subdomain="job",
                node_name="nobody-runs-this",
                containers=[client.V1Container(name="c", image="busybox")],
            ),
        ),
    )
    core.patch_namespaced_pod_status(
        "job-0",
        namespace,
        {"status": {"phase": "Pending", "podIP": "10.255.7.7", "podIPs": [{"ip": "10.255.7.7"}]}},
    )
    discovery = client.DiscoveryV1Api(kube)

    def endpoints() -> list[client.V1Endpoint]:
        slices = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=job"
        ).items
        return [e for s in slices for e in (s.endpoints or [])]

    eps = wait_for("an EndpointSlice endpoint for job-0", endpoints, timeout=30)
    assert [e.addresses for e in eps] == [["10.255.7.7"]]
    assert eps[0].hostname == "job-0"
    core.delete_namespaced_pod("job-0", namespace, grace_period_seconds=0)


def test_coredns_answers_cluster_names(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    rcode, addrs = dns_query_a(cluster.pod_host_ip, "kubernetes.default.svc.cluster.local")
    assert (rcode, addrs) == (0, ["10.96.0.1"])

    # A name that appears later resolves within seconds (no long negative cache).
    name = f"late.{namespace}.svc.cluster.local"
    assert dns_query_a(cluster.pod_host_ip, name)[0] == 3  # NXDOMAIN
    svc = client.CoreV1Api(kube).create_namespaced_service(
        namespace,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="late"),
            spec=client.V1ServiceSpec(ports=[client.V1ServicePort(port=80)]),
        ),
    )
    assert svc.spec is not None
    cluster_ip = svc.spec.cluster_ip
    wait_for(
        f"{name} to resolve",
        lambda: dns_query_a(cluster.pod_host_ip, name) == (0, [cluster_ip]),
        timeout=15,
    )


def _ps_mentioning(marker: str) -> list[str]:
    return [" ".join(procs.cmdline(p)) for p in procs.processes_mentioning(marker)]


def _phase(core: client.CoreV1Api, pod: str) -> str | None:
    status = core.read_namespaced_pod(pod, "default").status
    return status.phase if status else None


def _netns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_down_leaves_nothing_behind(cluster: Cluster) -> None:
    """A second, short-lived cluster next to the session's: up, run a pod if there is a node,
    down; then nothing of it may remain."""
    with_node = node_package_available()
    pod_pids: list[int] = []
    tmp = Path(tempfile.mkdtemp(prefix="localkube-down-"))
    other = Cluster(
        tmp, name=f"dn{random.randrange(10**6)}", base=pick_base(), die_with_parent=True
    )
    if not with_node:
        other.nodes = []
    other.up(timeout=120)
    try:
        # up() on a healthy cluster is a quick no-op that keeps the processes.
        pids = json.loads((tmp / "pids.json").read_text())
        t0 = time.monotonic()
        other.up()
        assert time.monotonic() - t0 < 5
        assert json.loads((tmp / "pids.json").read_text()) == pids

        # A crashed component makes the cluster stale: up() cleans it away and starts afresh.
        os.kill(pids["kube-apiserver"], signal.SIGKILL)
        wait_for("apiserver to die", lambda: not procs.pid_alive(pids["kube-apiserver"]), 10)
        assert not other.healthy()
        other.up(timeout=120)
        assert other.healthy()
        assert not any(procs.pid_alive(p) for p in pids.values())

        if with_node:
            api = other.api_client()
            core = client.CoreV1Api(api)
            core.create_namespaced_pod(
                "default",
                client.V1Pod(
                    metadata=client.V1ObjectMeta(name="sleeper"),
                    spec=client.V1PodSpec(
                        containers=[
                            client.V1Container(name="c", image="python", command=["sleep", "1000"])
                        ],
                        termination_grace_period_seconds=1,
                    ),
                ),
            )
            wait_for(
                "sleeper Running",
                lambda: _phase(core, "sleeper") == "Running",
                timeout=60,
            )
            api.close()
            pod_pids = wait_for(
                "the pod's processes in its network namespace",
                lambda: [p for ns in network.our_netns(other.net) for p in _netns_pids(ns)],
                timeout=15,
            )
        assert network.link_exists(other.bridge)
    finally:
        other.down()

    assert _ps_mentioning(str(tmp)) == []
    if with_node:
        assert [p for p in pod_pids if procs.pid_alive(p)] == []
    assert network.our_netns(other.net) == []
    assert not network.link_exists(other.bridge)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert other.bridge not in links
    assert procs.mounts_under(tmp) == []
    # The session's cluster is untouched.
    assert cluster.healthy()
    if os.environ.get("LOCALKUBE_KEEP_LOGS") != "1":
        shutil.rmtree(tmp, ignore_errors=True)
