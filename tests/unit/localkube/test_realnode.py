"""Real nodes' files and flags (the pure parts of realnode.py and the DNAT rule)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tomllib
from pathlib import Path
from typing import Any

from localkube import network, realnode
from localkube.network import PodNetwork
from localkube.realnode import RealNodeLayout, RealNodeSpec

NET = PodNetwork("rn1", 231)
LAYOUT = RealNodeLayout(Path("/tmp/lk"), "real-0", 2)


def test_each_node_owns_a_containerd_under_the_cluster_dir() -> None:
    cfg = tomllib.loads(realnode.containerd_config(LAYOUT, "localkube.dev/pause:3.10.1"))
    assert cfg["root"] == "/tmp/lk/realnodes/real-0/containerd/root"
    assert cfg["state"] == "/tmp/lk/realnodes/real-0/containerd/state"
    assert cfg["grpc"]["address"] == "/tmp/lk/realnodes/real-0/containerd.sock"
    assert cfg["ttrpc"]["address"] == "/tmp/lk/realnodes/real-0/containerd.sock.ttrpc"
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "localkube.dev/pause:3.10.1"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["cni"]["conf_dir"] == "/tmp/lk/realnodes/real-0/cni"


def test_pods_join_the_cluster_bridge_in_the_nodes_slice() -> None:
    conf: Any = realnode.cni_conflist(NET, LAYOUT)
    (bridge,) = conf["plugins"]
    assert bridge["bridge"] == "lk-rn1" and not bridge["isGateway"] and not bridge["ipMasq"]
    ((rng,),) = bridge["ipam"]["ranges"]
    # Node index 2 owns 10.231.3.0/24, as PodNetwork.pod_cidr(2) says; the /16 is on-link.
    assert (rng["subnet"], rng["rangeStart"], rng["rangeEnd"]) == (
        "10.231.0.0/16",
        "10.231.3.2",
        "10.231.3.254",
    )
    assert bridge["ipam"]["routes"] == [{"dst": "10.96.0.0/16", "gw": "10.231.0.1"}]


def test_kubelet_config_for_a_cgroup_v1_host_without_systemd() -> None:
    spec = RealNodeSpec("real-0", taints=[{"key": "k", "effect": "NoSchedule"}])
    cfg = realnode.kubelet_config(NET, LAYOUT, spec, Path("/ca.crt"), 10250, 10248)
    assert cfg["cgroupDriver"] == "cgroupfs" and cfg["failCgroupV1"] is False
    assert cfg["failSwapOn"] is False
    assert cfg["cgroupRoot"] == "/localkube-lk-rn1-real-0"
    assert cfg["podCIDR"] == "10.231.3.0/24"
    assert cfg["clusterDNS"] == ["10.231.0.1"]
    assert cfg["containerRuntimeEndpoint"] == "unix:///tmp/lk/realnodes/real-0/containerd.sock"
    assert cfg["authentication"]["anonymous"] == {"enabled": False}  # type: ignore[index]
    assert cfg["registerWithTaints"] == [{"key": "k", "effect": "NoSchedule"}]
    args = realnode.kubelet_args(Path("/bin"), LAYOUT, spec, Path("/admin.kc"), "10.231.0.1")
    assert "--node-labels=localkube.dev/node-kind=real" in args
    assert "--root-dir=/tmp/lk/realnodes/real-0/kubelet" in args


def test_pause_image_archive_is_an_oci_layout_ctr_can_import() -> None:
    data = realnode.pause_image_archive(b"\x7fELF-pause", "localkube.dev/pause:3.10.1")
    assert data == realnode.pause_image_archive(b"\x7fELF-pause", "localkube.dev/pause:3.10.1")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    for name, blob in files.items():
        if name.startswith("blobs/sha256/"):
            assert name.rsplit("/", 1)[1] == hashlib.sha256(blob).hexdigest()
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "localkube.dev/pause:3.10.1"
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["config"]["Entrypoint"] == ["/pause"]
    (layer,) = manifest["layers"]
    with tarfile.open(fileobj=io.BytesIO(files[f"blobs/sha256/{layer['digest'][7:]}"])) as t:
        (member,) = t.getmembers()
        assert member.name == "pause" and member.mode == 0o755


def test_service_dnat_rule_sends_the_kubernetes_service_to_the_apiserver() -> None:
    rule = network.service_dnat_rule(NET, "10.96.0.1", 6443)
    assert rule[:2] == ["-i", "lk-rn1"]
    assert rule[-3:] == ["DNAT", "--to-destination", "10.231.0.1:6443"]
    assert "localkube lk-rn1" in rule


def test_remove_service_dnat_deletes_our_rules_whatever_their_port() -> None:
    # As `iptables -t nat -S PREROUTING` prints it (Docker's rule beside ours).
    listing = (
        "-P PREROUTING ACCEPT\n"
        "-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n"
        "-A PREROUTING -d 10.96.0.1/32 -i lk-rn1 -p tcp -m tcp --dport 443 "
        '-m comment --comment "localkube lk-rn1" -j DNAT --to-destination 10.231.0.1:1234\n'
    )
    calls: list[list[str]] = []

    def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        out = listing if "-S" in cmd else ""
        return subprocess.CompletedProcess(cmd, 0, out, "")

    assert network.remove_service_dnat(NET, run) == ["iptables nat PREROUTING lk-rn1"]
    (delete,) = [c for c in calls if "-D" in c]
    assert delete[delete.index("-D") + 1 :] == [
        *["PREROUTING", "-d", "10.96.0.1/32", "-i", "lk-rn1", "-p", "tcp", "-m", "tcp"],
        *["--dport", "443", "-m", "comment", "--comment", "localkube lk-rn1"],
        *["-j", "DNAT", "--to-destination", "10.231.0.1:1234"],
    ]
