"""A real Kubernetes control plane as local processes: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, CoreDNS and the process node (`localkube.node`).

Everything one cluster owns lives under its directory:

    DIR/pki/               CA, apiserver serving cert, service-account keys
    DIR/admin.kubeconfig   system:masters client certificate, server https://127.0.0.1:<port>
    DIR/kubeconfigs/       minted kubeconfigs (users, service accounts)
    DIR/logs/<component>.log
    DIR/pids.json          {component: pid}; down() stops only these
    DIR/argv.json          {component: argv} as last started (restart_component)
    DIR/state.json         name, base, ports, bin dir, nodes
    DIR/node/              the process node's state (pods, their logs)
    DIR/realnodes/<name>/  a real node's containerd, kubelet and CNI files (localkube.realnode)

With `network_policies`, the cluster's NetworkPolicy enforcer (localkube.netpol) and the
iptables rule that queues packets to it start before the node, so that no pod runs unfiltered;
its log is DIR/logs/netpol.log.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from localkube import components, netpol, network, pki, procs, realnode, realnode_host
from localkube.components import Layout, NodeSpec, Ports
from localkube.kubeconfig import render_kubeconfig, write_kubeconfig
from localkube.pki import PkiPaths
from localkube.realnode import RealNodeLayout, RealNodeSpec

log = logging.getLogger("localkube")

ADMIN_USER = "localkube-admin"
# Start order; down() stops in reverse.
ORDER = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "coredns", "node"]
# Which directory's cluster owns each bridge, so two clusters never share one.
OWNERS = Path("/run/localkube/bridges")
BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "build.sh"
CLUSTER_PKG_ROOT = Path(__file__).resolve().parents[1]


def find_bin_dir() -> Path:
    """LOCALKUBE_BIN, else what cluster/build.sh prints (instant when its cache is warm)."""
    env = os.environ.get("LOCALKUBE_BIN")
    if env:
        return Path(env)
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def kubernetes_minor(bin_dir: Path) -> int | None:
    """The minor version of the kube-apiserver in `bin_dir` (`--version` prints
    "Kubernetes v1.37.2"); None if it says something else."""
    out = subprocess.run(
        [str(bin_dir / "kube-apiserver"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    return components.parse_minor(out.stdout)


def node_package_available() -> bool:
    try:
        return importlib.util.find_spec("localkube.node.__main__") is not None
    except ModuleNotFoundError:
        return False


class Cluster:
    def __init__(
        self,
        dir: Path | str,
        name: str = "local",
        base: int = 244,
        nodes: list[NodeSpec] | None = None,
        *,
        real_nodes: list[RealNodeSpec] | None = None,
        images: list[str] | None = None,
        die_with_parent: bool = False,
        network_policies: bool = False,
    ) -> None:
        """`die_with_parent`: the components get SIGTERM when the calling thread exits (for
        test sessions; the CLI leaves them running). `real_nodes`: kubelets with containerd
        beside the process node's nodes (localkube.realnode); `images`: images of the local
        Docker engine loaded onto each of them. `network_policies`: NetworkPolicies are
        enforced on the process node's pods (localkube.netpol; needs `cluster/build.sh
        netpol`); off, they are stored and nothing filters traffic."""
        self.dir = Path(dir).resolve()
        self.die_with_parent = die_with_parent
        self.name = name
        self.net = network.PodNetwork(name, base)
        # None: one default node when the process node exists, none otherwise.
        if nodes is None:
            nodes = components.default_nodes(1) if node_package_available() else []
        self.nodes = nodes
        self.real_nodes = list(real_nodes or [])
        self.images = list(images or [])
        self.network_policies = network_policies
        self.layout = Layout(self.dir)
        self._bin_dir: Path | None = None
        self._ports: Ports | None = None
        self.timings: dict[str, float] = {}

    # -- properties -------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.layout.admin_kubeconfig

    @property
    def logs_dir(self) -> Path:
        return self.layout.logs

    @property
    def pod_host_ip(self) -> str:
        return self.net.host_ip

    @property
    def bridge(self) -> str:
        return self.net.bridge

    @property
    def ports(self) -> Ports:
        if self._ports is None:
            state = self._read_state()
            if not state:
                raise RuntimeError(f"cluster in {self.dir} was never started")
            self._ports = Ports(**state["ports"])
        return self._ports

    @property
    def api_port(self) -> int:
        return self.ports.apiserver

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            state = self._read_state()
            self._bin_dir = Path(state["bin_dir"]) if state else find_bin_dir()
        return self._bin_dir

    @property
    def pki(self) -> PkiPaths:
        return PkiPaths(self.layout.pki)

    def real_node_layout(self, name: str) -> RealNodeLayout:
        """A real node's files; its pod /24 comes after the process node's."""
        names = [n.name for n in self.real_nodes]
        if name not in names:
            state = self._read_state()
            names = [str(n["name"]) for n in state.get("real_nodes", [])]
        return RealNodeLayout(self.dir, name, len(self.nodes) + names.index(name))

    # -- state files ------------------------------------------------------------------------

    def _read_json(self, path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _read_state(self) -> dict[str, Any]:
        return self._read_json(self.layout.state)

    def _read_pids(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._read_json(self.layout.pids).items()}

    def _record_pid(self, component: str, pid: int) -> None:
        pids = self._read_pids()
        pids[component] = pid
        self.layout.pids.write_text(json.dumps(pids, indent=1))

    def _log(self, component: str) -> Path:
        return self.layout.logs / f"{component}.log"

    # -- lifecycle --------------------------------------------------------------------------

    def up(self, timeout: float = 120.0) -> Cluster:
        """Starts the cluster and returns once nodes are Ready and the `default`
        ServiceAccount exists. A healthy cluster in this directory is reused as it is; a stale
        one (crashed, half started) is cleaned away first."""
        t0 = time.monotonic()
        self.timings = {}
        # A healthy cluster with the other NetworkPolicy setting is started afresh.
        same = bool(self._read_state().get("network_policies")) == self.network_policies
        if same and self.healthy():
            self.timings["reuse"] = time.monotonic() - t0
            log.info("cluster %s in %s is already up", self.name, self.dir)
            return self
        if self.layout.pids.exists() or self.layout.state.exists():
            self._teardown(keep_logs=True)
        try:
            self._start(timeout)
        except BaseException:
            self._teardown(keep_logs=True)
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def _step(self, name: str, t0: float) -> float:
        now = time.monotonic()
        self.timings[name] = now - t0
        log.info("%s: %.2fs", name, now - t0)
        return now

    def _start(self, timeout: float) -> None:
        t = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.layout.logs.mkdir(exist_ok=True)
        self._bin_dir = find_bin_dir()
        for b in ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]:
            if not (self._bin_dir / b).exists():
                raise RuntimeError(f"missing binary {self._bin_dir / b}")
        if not (self._bin_dir / "coredns").exists():
            raise RuntimeError(f"missing binary {self._bin_dir / 'coredns'} (run cluster/build.sh)")
        enforcer = netpol.binary(self._bin_dir)
        if self.network_policies and self.nodes and not enforcer.exists():
            raise RuntimeError(f"missing binary {enforcer} (run cluster/build.sh netpol)")
        for stale in [self.layout.etcd_data, self.layout.certs, self.layout.pki]:
            shutil.rmtree(stale, ignore_errors=True)
        self._claim_bridge()
        network.create_bridge(self.net)
        paths = pki.write_pki(self.layout.pki, self.net.host_ip)
        self._write_admin_cert(paths)
        self._ports = Ports(*procs.free_ports(7))
        self._write_admin_kubeconfig_file()
        self.layout.state.write_text(
            json.dumps(
                {
                    "name": self.name,
                    "base": self.net.base,
                    "bridge": self.net.bridge,
                    "ports": asdict(self._ports),
                    "bin_dir": str(self._bin_dir),
                    "nodes": [n.to_json() for n in self.nodes],
                    "real_nodes": [n.to_json() for n in self.real_nodes],
                    "network_policies": self.network_policies,
                },
                indent=1,
            )
        )
        self.layout.pids.write_text("{}")
        t = self._step("prepare", t)

        ports, layout, bins = self._ports, self.layout, self._bin_dir
        etcd = self._launch("etcd", components.etcd_args(bins, layout, ports))
        procs.wait_until(
            "etcd",
            lambda: procs.http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"),
            etcd,
            self._log("etcd"),
            timeout,
        )
        t = self._step("etcd", t)

        minor = kubernetes_minor(bins)
        admin = (self.pki.client_cert(ADMIN_USER), self.pki.client_key(ADMIN_USER))
        api = self._launch(
            "kube-apiserver",
            components.apiserver_args(
                bins,
                layout,
                ports,
                self.net.host_ip,
                realnode.kubelet_client_args(*admin),
                minor=minor,
            ),
        )
        ctx = self._admin_ssl()
        procs.wait_until(
            "kube-apiserver",
            lambda: procs.http_ok(f"{self.server}/readyz", ctx),
            api,
            self._log("kube-apiserver"),
            timeout,
        )
        t = self._step("kube-apiserver", t)

        kcm = self._launch(
            "kube-controller-manager",
            components.controller_manager_args(bins, layout, ports, minor=minor),
        )
        sched = self._launch(
            "kube-scheduler", components.scheduler_args(bins, layout, ports, minor=minor)
        )
        layout.corefile.write_text(
            components.render_corefile(self.net.host_ip, layout.admin_kubeconfig, ports)
        )
        dns = self._launch("coredns", components.coredns_args(bins, layout))
        insecure = procs.insecure_context()
        for name, proc, url in [
            ("kube-controller-manager", kcm, f"https://127.0.0.1:{ports.controller_manager}"),
            ("kube-scheduler", sched, f"https://127.0.0.1:{ports.scheduler}"),
        ]:
            procs.wait_until(
                name,
                lambda url=url: procs.http_ok(f"{url}/healthz", insecure),  # type: ignore[misc]
                proc,
                self._log(name),
                timeout,
            )
        procs.wait_until(
            "coredns",
            lambda: procs.http_ok(f"http://127.0.0.1:{ports.dns_ready}/ready"),
            dns,
            self._log("coredns"),
            timeout,
        )
        t = self._step("controllers+dns", t)

        kubelets = self._start_real_nodes(timeout) if self.real_nodes else []
        if kubelets:
            t = self._step("real-nodes-started", t)
        if self.network_policies and self.nodes:
            self._start_enforcer(timeout)
            t = self._step("netpol", t)
        node = None
        if self.nodes:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(
                [str(CLUSTER_PKG_ROOT), *filter(None, [env.get("PYTHONPATH")])]
            )
            node = self._launch(
                "node",
                components.node_args(
                    sys.executable,
                    layout,
                    self.nodes,
                    self.net.host_ip,
                    self.net.base,
                    ports.apiserver,
                    self.net.bridge,
                ),
                env=env,
            )
        api_client = self.api_client()
        try:
            from kubernetes import client

            core = client.CoreV1Api(api_client)
            procs.wait_until(
                "default ServiceAccount",
                lambda: _exists(lambda: core.read_namespaced_service_account("default", "default")),
                kcm,
                self._log("kube-controller-manager"),
                timeout,
            )
            t = self._step("default-serviceaccount", t)
            if self.nodes:
                names = {n.name for n in self.nodes}
                procs.wait_until(
                    "nodes Ready",
                    lambda: _nodes_ready(core, names),
                    node,
                    self._log("node"),
                    timeout,
                )
                t = self._step("nodes-ready", t)
            for spec, kubelet in zip(self.real_nodes, kubelets, strict=True):
                procs.wait_until(
                    f"real node {spec.name} Ready",
                    lambda spec=spec: _nodes_ready(core, {spec.name}),  # type: ignore[misc]
                    kubelet,
                    self._log(f"kubelet-{spec.name}"),
                    timeout,
                )
            if kubelets:
                t = self._step("real-nodes-ready", t)
        finally:
            api_client.close()

    def _start_enforcer(self, timeout: float) -> None:
        """kube-network-policies for the whole cluster (localkube.netpol says why one), ready
        once its nfqueue has a listener, and the rule that queues new connections to it."""
        kubeconfig = self.mint_kubeconfig("kube-network-policies", ["system:masters"])
        argv = netpol.enforcer_args(netpol.binary(self.bin_dir), kubeconfig, self.net)
        netpol.add_queue_rule(self.net)
        proc = self._launch(netpol.COMPONENT, argv)
        queue = netpol.queue_id(self.net)
        procs.wait_until(
            netpol.COMPONENT,
            lambda: netpol.queue_bound(queue),
            proc,
            self._log(netpol.COMPONENT),
            timeout,
        )

    def _start_real_nodes(self, timeout: float) -> list[subprocess.Popen[bytes]]:
        """containerd, then the pause image and `images`, then the kubelet, for each real node.
        Returns the kubelets; the caller waits for their nodes to turn Ready."""
        missing = realnode_host.missing_packages()
        if missing:
            raise RuntimeError(
                f"real nodes need Debian packages: apt-get install {' '.join(missing)} "
                "(hack/realnode-deps.sh)"
            )
        bins = self.bin_dir
        for b in ("kubelet", "pause", "pause.tag"):
            if not (bins / b).exists():
                raise RuntimeError(f"missing {bins / b} (run cluster/build.sh kubelet)")
        pause_ref = realnode.pause_ref((bins / "pause.tag").read_text().strip())
        pause_archive = realnode.pause_image_archive((bins / "pause").read_bytes(), pause_ref)
        network.add_service_dnat(self.net, pki.FIRST_SERVICE_IP, self.ports.apiserver)
        kubelets = []
        for spec in self.real_nodes:
            lay = self.real_node_layout(spec.name)
            # A crashed run's address leases would only shift the addresses handed out.
            shutil.rmtree(lay.ipam_dir, ignore_errors=True)
            for d in (lay.cni_conf_dir, lay.pod_logs, lay.kubelet_root, lay.ipam_dir):
                d.mkdir(parents=True, exist_ok=True)
            lay.containerd_config.write_text(realnode.containerd_config(lay, pause_ref))
            (lay.cni_conf_dir / "10-localkube.conflist").write_text(
                json.dumps(realnode.cni_conflist(self.net, lay), indent=1)
            )
            containerd = self._launch(f"containerd-{spec.name}", realnode.containerd_args(lay))
            procs.wait_until(
                f"containerd of {spec.name}",
                lambda lay=lay: (
                    subprocess.run(  # type: ignore[misc]
                        realnode_host.ctr(lay, "version"), capture_output=True, check=False
                    ).returncode
                    == 0
                ),
                containerd,
                self._log(f"containerd-{spec.name}"),
                timeout,
            )
            realnode_host.import_archive(lay, pause_archive)
            for image in self.images:
                took = realnode_host.import_docker_image(lay, image)
                log.info("%s: %s imported in %.1fs", spec.name, image, took)
            realnode_host.create_cgroup_root(realnode.cgroup_root(self.net, spec.name))
            kport, hport = procs.free_ports(2)
            lay.kubelet_config.write_text(
                json.dumps(
                    realnode.kubelet_config(self.net, lay, spec, self.pki.ca_cert, kport, hport),
                    indent=1,
                )
            )
            argv = realnode.kubelet_args(
                bins, lay, spec, self.layout.admin_kubeconfig, self.net.host_ip
            )
            kubelets.append(self._launch(f"kubelet-{spec.name}", argv))
        return kubelets

    def _stop_real_nodes(self, state: dict[str, Any], pids: dict[str, int]) -> None:
        """Kubelet, then whatever runs in its cgroup root (containers outlive their kubelet and
        containerd), then containerd and its shims."""
        marker = str(self.dir)
        net = network.PodNetwork(
            str(state.get("name", self.name)), int(state.get("base", 0)) or self.net.base
        )
        for entry in state.get("real_nodes", []):
            name = str(entry["name"])
            lay = self.real_node_layout(name)
            pid = pids.get(f"kubelet-{name}")
            if pid is not None and self._owned(pid, marker):
                procs.stop(pid, grace=10.0)
            realnode_host.remove_cgroup_root(realnode.cgroup_root(net, name))
            pid = pids.get(f"containerd-{name}")
            if pid is not None and self._owned(pid, marker):
                procs.stop(pid, grace=10.0)
            realnode_host.stop_shims(lay)

    def _claim_bridge(self) -> None:
        """Refuses to take over a bridge that a live cluster in another directory uses (two
        sessions that both chose the default name)."""
        OWNERS.mkdir(parents=True, exist_ok=True)
        owner_file = OWNERS / self.net.bridge
        try:
            owner = Path(owner_file.read_text().strip())
        except OSError:
            owner = None
        if owner is not None and owner != self.dir and network.link_exists(self.net.bridge):
            other = Cluster(owner, name=self.name, base=self.net.base, nodes=[])
            pids = other._read_pids()
            if any(procs.is_ours(p, str(owner)) for p in pids.values()):
                raise RuntimeError(
                    f"bridge {self.net.bridge} belongs to the running cluster in {owner}; "
                    "choose another name (and base), or stop that one"
                )
        owner_file.write_text(f"{self.dir}\n")

    def _launch(
        self, component: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        logf = self._log(component)
        with open(logf, "a") as f:
            f.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n")
        proc = procs.start(argv, logf, env=env, cwd=self.dir, die_with_parent=self.die_with_parent)
        self._record_pid(component, proc.pid)
        if env is None:  # a component started with our environment can be started again
            argvs = self._read_json(self._argv_file)
            argvs[component] = argv
            self._argv_file.write_text(json.dumps(argvs, indent=1))
        return proc

    @property
    def _argv_file(self) -> Path:
        return self.dir / "argv.json"

    def restart_component(
        self, component: str, down_for: float = 0.0, timeout: float = 60.0
    ) -> int:
        """SIGKILLs one control-plane component (no grace: its connections break, as in a
        crash), keeps it down `down_for` seconds, starts it again with the argv it was started
        with and returns its new pid once it answers its health check. With
        `die_with_parent`, the new process dies with the calling thread: call this from a
        thread that outlives the cluster's use."""
        url = ready_url(component, self.server, self.ports)
        pid = self._read_pids().get(component)
        argv = self._read_json(self._argv_file).get(component)
        if pid is None or not isinstance(argv, list) or not self._owned(pid, str(self.dir)):
            raise RuntimeError(f"{component} of the cluster in {self.dir} is not running")
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)  # our child when this process started it
            if not procs.pid_alive(pid):
                break
            time.sleep(0.05)
        time.sleep(down_for)
        proc = self._launch(component, [str(a) for a in argv])
        ctx = self._admin_ssl() if component == "kube-apiserver" else procs.insecure_context()
        procs.wait_until(
            component, lambda: procs.http_ok(url, ctx), proc, self._log(component), timeout
        )
        return proc.pid

    def down(self) -> None:
        """Stops the recorded processes (SIGTERM, then SIGKILL), removes the bridge and this
        cluster's network namespaces and veths, and unmounts anything under the directory."""
        t0 = time.monotonic()
        self._teardown(keep_logs=True)
        self.timings["down"] = time.monotonic() - t0

    def _teardown(self, keep_logs: bool) -> None:
        pids = self._read_pids()
        state = self._read_state()
        marker = str(self.dir)
        if state.get("real_nodes"):
            if "node" in pids and self._owned(pids["node"], marker):
                procs.stop(pids["node"], grace=30.0)
            self._stop_real_nodes(state, pids)
        for component in reversed(ORDER):
            pid = pids.get(component)
            if pid is None or not self._owned(pid, marker):
                continue
            # The node cleans up its pods on SIGTERM: give it time to do so.
            procs.stop(pid, grace=30.0 if component == "node" else 10.0)
            if component == "node":  # its pods are gone: their enforcer goes next
                self._stop_enforcer(pids, marker)
        self._stop_enforcer(pids, marker)  # a cluster whose node never started
        nets = {self.net}
        if state.get("name") and state.get("base"):
            nets.add(network.PodNetwork(str(state["name"]), int(state["base"])))
        removed = []
        for net in nets:
            owner_file = OWNERS / net.bridge
            try:
                owner = Path(owner_file.read_text().strip())
            except OSError:
                owner = self.dir
            if owner != self.dir:
                continue  # another directory's cluster took this bridge over since
            removed += network.cleanup(net)
            removed += netpol.remove_queue_rules(net)
            with contextlib.suppress(FileNotFoundError):
                owner_file.unlink()
        if removed:
            log.info("removed %s", ", ".join(removed))
        procs.unmount_under(self.dir)
        with contextlib.suppress(FileNotFoundError):
            self.layout.pids.unlink()
        if not keep_logs:
            shutil.rmtree(self.layout.logs, ignore_errors=True)

    def _stop_enforcer(self, pids: dict[str, int], marker: str) -> None:
        """SIGTERM; its queue rule stays until the bridge goes (packets bypass an unbound
        queue) and is removed with it, after a kill too."""
        pid = pids.get(netpol.COMPONENT)
        if pid is not None and self._owned(pid, marker):
            procs.stop(pid, grace=10.0)

    def _owned(self, pid: int, marker: str) -> bool:
        # Every component's flags name files under DIR; the recorded PID is ours only while
        # its command line still says so (PIDs are reused).
        return procs.is_ours(pid, marker)

    def healthy(self) -> bool:
        state = self._read_state()
        pids = self._read_pids()
        if not state or not pids:
            return False
        if state.get("name") != self.name or state.get("base") != self.net.base:
            return False
        real = [
            f"{c}-{n['name']}"
            for n in state.get("real_nodes", [])
            for c in ("containerd", "kubelet")
        ]
        enforcing = bool(state.get("network_policies") and state.get("nodes"))
        enforcer = [netpol.COMPONENT] if enforcing else []
        expected = (ORDER if state.get("nodes") else ORDER[:-1]) + real + enforcer
        if any(c not in pids or not procs.is_ours(pids[c], str(self.dir)) for c in expected):
            return False
        if not network.link_exists(self.net.bridge):
            return False
        if enforcing and not netpol.has_queue_rule(self.net):
            return False
        self._ports = Ports(**state["ports"])
        self._bin_dir = Path(state["bin_dir"])
        return procs.http_ok(f"{self.server}/readyz", self._admin_ssl())

    def status(self) -> dict[str, Any]:
        state = self._read_state()
        pids = self._read_pids()
        comps = {
            c: {"pid": pids.get(c), "running": bool(pids.get(c)) and procs.pid_alive(pids[c])}
            for c in pids
        }
        return {
            "name": self.name,
            "dir": str(self.dir),
            "healthy": self.healthy(),
            "kubeconfig": str(self.kubeconfig),
            "api_port": state.get("ports", {}).get("apiserver"),
            "bridge": state.get("bridge", self.net.bridge),
            "pod_host_ip": self.net.host_ip,
            "nodes": [n["name"] for n in state.get("nodes", [])],
            "real_nodes": [n["name"] for n in state.get("real_nodes", [])],
            "components": comps,
        }

    # -- credentials ------------------------------------------------------------------------

    def _write_admin_cert(self, paths: PkiPaths) -> None:
        admin = pki.make_client_cert(pki.load_ca(paths), ADMIN_USER, ["system:masters"])
        paths.client_cert(ADMIN_USER).write_bytes(admin.cert_pem)
        paths.client_key(ADMIN_USER).write_bytes(admin.key_pem)
        paths.client_key(ADMIN_USER).chmod(0o600)

    def _write_admin_kubeconfig_file(self) -> None:
        cert = self.pki.client_cert(ADMIN_USER).read_bytes()
        key = self.pki.client_key(ADMIN_USER).read_bytes()
        config = render_kubeconfig(
            self.server, self.pki.ca_cert.read_bytes(), ADMIN_USER, cert_pem=cert, key_pem=key
        )
        write_kubeconfig(self.kubeconfig, config)

    def _admin_ssl(self) -> Any:
        return procs.client_context(
            self.pki.ca_cert, self.pki.client_cert(ADMIN_USER), self.pki.client_key(ADMIN_USER)
        )

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def mint_kubeconfig(self, user: str, groups: list[str] | tuple[str, ...] = ()) -> Path:
        """A kubeconfig that authenticates as `user` in `groups` with a client certificate."""
        kc = pki.make_client_cert(pki.load_ca(self.pki), user, groups)
        tag = hashlib.sha256("\0".join([user, *groups]).encode()).hexdigest()[:8]
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
        config = render_kubeconfig(
            self.server,
            self.pki.ca_cert.read_bytes(),
            user,
            cert_pem=kc.cert_pem,
            key_pem=kc.key_pem,
        )
        return write_kubeconfig(self.layout.kubeconfigs / f"user-{safe}-{tag}.kubeconfig", config)

    def mint_service_account_kubeconfig(
        self, namespace: str, sa: str, expiration_seconds: int = 86400
    ) -> Path:
        """A kubeconfig with a bound token for the ServiceAccount (TokenRequest API)."""
        from kubernetes import client

        api = self.api_client()
        try:
            resp = client.CoreV1Api(api).create_namespaced_service_account_token(
                sa,
                namespace,
                client.AuthenticationV1TokenRequest(
                    spec=client.V1TokenRequestSpec(
                        audiences=[components.SA_ISSUER], expiration_seconds=expiration_seconds
                    )
                ),
            )
        finally:
            api.close()
        config = render_kubeconfig(
            self.server,
            self.pki.ca_cert.read_bytes(),
            f"system:serviceaccount:{namespace}:{sa}",
            token=_token(resp),
            namespace=namespace,
        )
        return write_kubeconfig(self.layout.kubeconfigs / f"sa-{namespace}-{sa}.kubeconfig", config)


def ready_url(component: str, server: str, ports: Ports) -> str:
    """Where a restartable control-plane component says it is ready (as `_start` waits for
    it); ValueError for any other component (CoreDNS, nodes: restart_component does not
    know how to start them again)."""
    urls = {
        "etcd": f"http://127.0.0.1:{ports.etcd_client}/health",
        "kube-apiserver": f"{server}/readyz",
        "kube-controller-manager": f"https://127.0.0.1:{ports.controller_manager}/healthz",
        "kube-scheduler": f"https://127.0.0.1:{ports.scheduler}/healthz",
    }
    if component not in urls:
        raise ValueError(f"cannot restart {component!r}: one of {sorted(urls)}")
    return urls[component]


def _exists(read: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        read()
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _nodes_ready(core: Any, names: set[str]) -> bool:
    ready = set()
    for n in core.list_node().items:
        conds = {c.type: c.status for c in (n.status.conditions or [])}
        taints = {t.key for t in (n.spec.taints or [])}
        # The node lifecycle controller lifts the not-ready taint a moment after Ready=True;
        # until then the scheduler would not place pods there.
        if conds.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints:
            ready.add(n.metadata.name)
    return names <= ready


def _token(resp: Any) -> str:
    if resp.status is None or not resp.status.token:
        raise RuntimeError("TokenRequest returned no token")
    return str(resp.status.token)
