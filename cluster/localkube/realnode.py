"""Real nodes: a kubelet built from the control plane's own Kubernetes module, with Debian's
containerd, runc and CNI plugins, so that pods run as containers from images (memory limits
and OOM kills, an IPC namespace and a memory-backed /dev/shm, the kubelet's probes, grace
periods and termination messages). Pure: specs in, argv lists and file contents out; the
host side (cgroups, starting, importing images, stopping) is localkube.realnode_host.

Each real node owns DIR/realnodes/<name>/ with its own containerd (root, state, sockets), so
it never meets Docker's containerd or another node's. Its pods join the cluster's bridge
(CNI `bridge` plugin on `lk-<name>`, no gateway address of its own, no NAT) with addresses from
the node's /24 of the pod network, like the process node's pods: the forwarding rules that
admit the bridge (localkube.network.forward_rules) admit them too, and they reach the host
address (apiserver, CoreDNS) and every other pod on-link. There is no kube-proxy: the one
Service a container is told about by the kubelet, `kubernetes` (KUBERNETES_SERVICE_HOST is its
ClusterIP), is translated to the apiserver by one DNAT rule (network.service_dnat_rule), and
the pods route the service range through the host address.

The host has cgroup v1 and no systemd: cgroupfs driver, cgroup v1 allowed, swap allowed. Each
kubelet has a cgroup root of its own (cgroup_root) that the host side creates and, on the way
down, empties (killing what is left in it) and removes.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from localkube.components import CLUSTER_DOMAIN, SERVICE_CIDR
from localkube.network import PodNetwork

# The label every real node carries, for nodeSelector.
NODE_KIND_LABEL = "localkube.dev/node-kind"
REAL = "real"
# Where containerd's CRI keeps Kubernetes' images and containers (`ctr -n`).
CRI_NAMESPACE = "k8s.io"
# What the CRI plugin runs as each pod's sandbox; made from the build's pause binary.
PAUSE_IMAGE = "localkube.dev/pause"
CNI_BIN_DIR = Path("/usr/lib/cni")


@dataclass(frozen=True)
class RealNodeSpec:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)

    def all_labels(self) -> dict[str, str]:
        return {NODE_KIND_LABEL: REAL, **self.labels}

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "labels": dict(self.labels), "taints": list(self.taints)}


def default_real_nodes(count: int) -> list[RealNodeSpec]:
    return [RealNodeSpec(f"real-{i}") for i in range(count)]


@dataclass(frozen=True)
class RealNodeLayout:
    """Where one real node keeps its files; `index` picks its /24 of the pod network (after
    the process node's)."""

    cluster_dir: Path
    name: str
    index: int

    @property
    def dir(self) -> Path:
        return self.cluster_dir / "realnodes" / self.name

    @property
    def containerd_config(self) -> Path:
        return self.dir / "containerd.toml"

    @property
    def containerd_root(self) -> Path:
        return self.dir / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.dir / "containerd" / "state"

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni"

    @property
    def ipam_dir(self) -> Path:
        return self.dir / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.dir / "kubelet.json"

    @property
    def pod_logs(self) -> Path:
        return self.dir / "pod-logs"


def cgroup_root(net: PodNetwork, node: str) -> str:
    """The kubelet's --cgroup-root: per cluster bridge and node, so two kubelets on one host
    (two nodes, two clusters) never manage the same kubepods tree."""
    return f"/localkube-{net.bridge}-{node}"


def pause_ref(tag: str) -> str:
    return f"{PAUSE_IMAGE}:{tag}"


def containerd_config(layout: RealNodeLayout, pause: str) -> str:
    """containerd 1.6+ (config version 2) with everything under the node's folder. The CRI
    plugin runs runc with cgroupfs (no systemd here), takes CNI plugins from Debian's
    containernetworking-plugins and the network from the node's own conf folder."""
    sock = str(layout.socket)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""\
version = 2
root = {json.dumps(str(layout.containerd_root))}
state = {json.dumps(str(layout.containerd_state))}

[grpc]
  address = {json.dumps(sock)}

[ttrpc]
  address = {json.dumps(sock + ".ttrpc")}

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {json.dumps(str(layout.dir / "containerd" / "opt"))}

[{cri}]
  sandbox_image = {json.dumps(pause)}
  enable_selinux = false
  disable_apparmor = true
  # The kubelet asks for negative oom_score_adj (the sandbox, Guaranteed pods); on these
  # machines even root with every capability may not lower it (EACCES), and runc then fails
  # to start any container. Clamped to containerd's own (0) instead.
  restrict_oom_score_adj = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = {json.dumps(str(CNI_BIN_DIR))}
  conf_dir = {json.dumps(str(layout.cni_conf_dir))}
  max_conf_num = 1
"""


def containerd_args(layout: RealNodeLayout) -> list[str]:
    return ["containerd", "--config", str(layout.containerd_config)]


def node_range(net: PodNetwork, index: int) -> tuple[str, str]:
    """First and last pod address of node `index` (its /24 as PodNetwork.pod_cidr says, less
    .0, .1 and .255)."""
    prefix = net.pod_cidr(index).rsplit(".", 1)[0]
    return f"{prefix}.2", f"{prefix}.254"


def cni_conflist(net: PodNetwork, layout: RealNodeLayout) -> dict[str, object]:
    """Pods on the cluster's bridge with a /16 (every pod and the host address on-link), and a
    route for the service range through the host address (the DNAT to the apiserver)."""
    first, last = node_range(net, layout.index)
    return {
        "cniVersion": "0.4.0",
        "name": f"localkube-{net.bridge}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                # The bridge holds the host address already; no gateway address, no NAT.
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.ipam_dir),
                    "ranges": [
                        [
                            {
                                "subnet": net.cidr,
                                "rangeStart": first,
                                "rangeEnd": last,
                                "gateway": net.host_ip,
                            }
                        ]
                    ],
                    "routes": [{"dst": SERVICE_CIDR, "gw": net.host_ip}],
                },
            }
        ],
    }


def kubelet_config(
    net: PodNetwork,
    layout: RealNodeLayout,
    spec: RealNodeSpec,
    ca_file: Path,
    port: int,
    healthz_port: int,
) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # The API (logs, exec) on the host address; the apiserver authenticates with its
        # kubelet client certificate, which the webhook authorizer checks like any user.
        "address": net.host_ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{layout.socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root(net, spec.name),
        "cgroupsPerQOS": True,
        # This host: cgroup v1 (which the kubelet refuses by default from some release between
        # v1.34 and v1.37), swap possible, no systemd.
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDNS": [net.host_ip],
        "clusterDomain": CLUSTER_DOMAIN,
        "podCIDR": net.pod_cidr(layout.index),
        "podLogsDir": str(layout.pod_logs),
        "registerWithTaints": list(spec.taints),
        # Images come from `ctr images import`, never a registry: never collect them, and no
        # eviction for a full disk of a shared build machine.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
    }


def kubelet_args(
    bin_dir: Path,
    layout: RealNodeLayout,
    spec: RealNodeSpec,
    kubeconfig: Path,
    node_ip: str,
) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in sorted(spec.all_labels().items()))
    return [
        str(bin_dir / "kubelet"),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={layout.kubelet_root}",
        f"--hostname-override={spec.name}",
        f"--node-ip={node_ip}",
        f"--node-labels={labels}",
        "--v=1",
    ]


def kubelet_client_args(client_cert: Path, client_key: Path) -> list[str]:
    """kube-apiserver flags for talking to kubelets (logs, exec, port-forward)."""
    return [
        f"--kubelet-client-certificate={client_cert}",
        f"--kubelet-client-key={client_key}",
        # Node names do not resolve on the host: the kubelet is at the node's InternalIP.
        "--kubelet-preferred-address-types=InternalIP",
    ]


def _tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A reproducible tar (mtime 0, root-owned) of name -> (content, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pause_image_archive(pause_binary: bytes, ref: str) -> bytes:
    """An OCI image archive (what `ctr images import` reads) of one static binary, /pause, run
    as nobody: the pod sandbox image, made here because no registry serves one."""

    def desc(media_type: str, data: bytes) -> dict[str, object]:
        return {
            "mediaType": media_type,
            "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }

    def dump(obj: object) -> bytes:
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    layer = _tar_bytes({"pause": (pause_binary, 0o755)})
    layer_desc = desc("application/vnd.oci.image.layer.v1.tar", layer)
    config = dump(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
    )
    manifest = dump(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": desc("application/vnd.oci.image.config.v1+json", config),
            "layers": [layer_desc],
        }
    )
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                **desc("application/vnd.oci.image.manifest.v1+json", manifest),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    blobs = {
        f"blobs/sha256/{hashlib.sha256(b).hexdigest()}": (b, 0o644)
        for b in (layer, config, manifest)
    }
    return _tar_bytes(
        {
            "oci-layout": (dump({"imageLayoutVersion": "1.0.0"}), 0o644),
            "index.json": (dump(index), 0o644),
            **blobs,
        }
    )
