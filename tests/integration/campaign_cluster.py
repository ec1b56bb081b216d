"""What the fault campaign (tests/integration/faultrun.py) drives of its cluster: a local
cluster of its own with what the scenarios need, its apiserver stopped or restarted (one
outage at a time, campaign-wide), and the campaign's own client, which outlasts outages."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import urllib3
from campaign_scenarios import KUEUE, SKEWED_NODES, Scenario, needs_of
from dtj import GROUP, PLURAL, VERSION
from hostprocs import descendants_named, stopped
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from localkube.testing import wait_for
from nodes import node_containers

MIN_UP_SECONDS = 45.0  # between two apiserver outages, campaign-wide


class Apiserver:
    """The apiserver of the campaign's own cluster (a localkube Cluster), which runs stop
    (SIGSTOP) or kill and start again. One such fault at a time in the whole campaign, each
    carried out by one thread that lives as long as the campaign: a restarted apiserver gets
    SIGTERM when the thread that started it ends (localkube's die_with_parent)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self._work: queue.Queue[tuple[Callable[[], None], list[BaseException], threading.Event]]
        self._work = queue.Queue()
        # Seconds the apiserver has been stopped or restarting, campaign-wide: every run's
        # deadline is extended by what it lived through (a run cannot finish while it is down).
        self.down = 0.0
        threading.Thread(target=self._serve, name="apiserver-faults", daemon=True).start()

    def _serve(self) -> None:
        while True:
            act, errors, done = self._work.get()
            start = time.monotonic()
            try:
                act()
            except Exception as e:  # noqa: BLE001 - handed to the run that asked
                errors.append(e)
            finally:
                self.down += time.monotonic() - start
                done.set()
            # Up for a while before the next one: with runs side by side, their outages back
            # to back kept the apiserver down most of the time (no namespace got its default
            # ServiceAccount within a minute), which tests nothing but patience.
            time.sleep(MIN_UP_SECONDS)

    def _do(self, act: Callable[[], None]) -> None:
        errors: list[BaseException] = []
        done = threading.Event()
        self._work.put((act, errors, done))
        done.wait()
        if errors:
            raise errors[0]

    def pid(self) -> int:
        pid: int = self.cluster.status()["components"]["kube-apiserver"]["pid"]
        return pid

    def pause(self, seconds: float) -> None:
        def act() -> None:
            pid = self.pid()
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                os.kill(pid, signal.SIGCONT)

        self._do(act)

    def restart(self, down_for: float) -> None:
        def act() -> None:
            self.cluster.restart_component("kube-apiserver", down_for, 120)
            # Ready is not yet serving: until the CRDs' paths are installed it answers 503.
            custom = client.CustomObjectsApi(resilient_client(self.cluster.kubeconfig))
            wait_for("our API served", lambda: _serves(custom), 120, interval=0.5)

        self._do(act)


class KindApiserver(Apiserver):
    """The apiserver of a kind cluster of this host (tests/e2e/kind.sh): a static pod in the
    control-plane node's container, whose processes this host sees. Stopped as localkube's
    is (SIGSTOP, then SIGCONT); restarted by killing it while the node's kubelet is stopped,
    then, `down_for` s later, killing that kubelet too: the node's systemd starts a new one
    (Restart=always, 1 s), which starts the apiserver at once. Resuming the old kubelet
    instead left the apiserver in its crash back-off (10 s, doubling to 5 minutes, forgotten
    only after 10 minutes up): a second campaign on a kept cluster found it down for minutes
    and every run's client gave up."""

    def __init__(self, kubeconfig: Path, container: str) -> None:
        super().__init__(None)
        self.kubeconfig = kubeconfig
        self.container = container

    def _node_process(self, name: str) -> int:
        init = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Pid}}", self.container],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        found = descendants_named(int(init), name)
        if len(found) != 1:
            raise RuntimeError(f"{self.container}: {len(found)} processes named {name}")
        return found[0]

    def pid(self) -> int:
        return self._node_process("kube-apiserver")

    def restart(self, down_for: float) -> None:
        def act() -> None:
            kubelet = self._node_process("kubelet")
            os.kill(kubelet, signal.SIGSTOP)
            try:
                os.kill(self.pid(), signal.SIGKILL)
                time.sleep(down_for)
            finally:
                # A stopped process takes SIGKILL as well; its systemd unit starts a new one.
                os.kill(kubelet, signal.SIGKILL)
            custom = client.CustomObjectsApi(resilient_client(self.kubeconfig))
            wait_for("our API served", lambda: _serves(custom), 180, interval=0.5)

        self._do(act)

    def recover(self, timeout: float = 360) -> None:
        """After a campaign that may have been killed mid-fault: a kubelet left stopped (by a
        restart) is killed, as restart ends, so that a new one starts the apiserver without
        the old one's crash back-off; a paused apiserver goes on (SIGCONT; harmless when
        running); then the API serves again."""
        # RuntimeError: not running now (systemd starts the kubelet, the kubelet the apiserver)
        with contextlib.suppress(RuntimeError):
            kubelet = self._node_process("kubelet")
            if stopped(kubelet):
                os.kill(kubelet, signal.SIGKILL)
        with contextlib.suppress(RuntimeError):
            os.kill(self.pid(), signal.SIGCONT)
        custom = client.CustomObjectsApi(resilient_client(self.kubeconfig))
        wait_for("our API served", lambda: _serves_now(custom), timeout, interval=1)


def _serves_now(custom: client.CustomObjectsApi) -> bool:
    try:
        return _serves(custom)
    except (ApiException, urllib3.exceptions.HTTPError, OSError):
        return False


def kind_control_plane(kubeconfig: Path) -> str | None:
    """The control-plane node's container of a kind cluster of this host, else None."""
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        containers = node_containers(api)
        nodes: Any = client.CoreV1Api(api).list_node(
            label_selector="node-role.kubernetes.io/control-plane"
        )
    finally:
        api.close()
    names = [containers.get(n.metadata.name) for n in nodes.items]
    return names[0] if len(names) == 1 and names[0] else None


def _serves(custom: client.CustomObjectsApi) -> bool:
    try:
        custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
    except ApiException as e:
        if e.status == 503:
            return False
        raise
    return True


# What a restarting apiserver answers before it serves: 503 while it installs its paths, 403
# (to the admin too) until its RBAC caches have synced, and 429 (with Retry-After) while its
# priority and fairness queues are full of every client coming back at once (kind's, in a
# kind run). Nothing was written in any of them.
RESTARTING_STATUSES = frozenset({403, 429, 503})


def resilient_client(kubeconfig: Path) -> client.ApiClient:
    """The campaign's own client: a request the apiserver refused because it was down (a
    restart fault of any run) is tried again for about a minute, and so are a TLS handshake
    it broke off while starting, a read whose connection broke, and a read or an idempotent
    write answered 503 (a restarted apiserver installing its paths), 403 (kind's, before
    its RBAC caches have synced, refuses even the admin) or 429 (its queues full: after the
    Retry-After it names); other writes are not (they may have landed: see create_retrying)."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.retries = urllib3.Retry(
        total=None, connect=40, read=3, status=30, other=40, backoff_factor=0.5,
        backoff_max=2, status_forcelist=RESTARTING_STATUSES, raise_on_status=False,
    )  # fmt: skip
    return client.ApiClient(cfg)


class Pauser:
    """The run's apiserver faults in turn, each `after` seconds from the start (or from the
    end of the previous one): a pause (SIGSTOP, then SIGCONT) or a restart (SIGKILL, then
    started again). Others' runs wait meanwhile (one at a time, Apiserver); a fault that
    could not be carried out is the run's violation."""

    def __init__(
        self,
        apiserver: Apiserver | None,
        outages: list[tuple[str, dict[str, Any]]],
        abort: threading.Event,
    ) -> None:
        self.fired: Counter[str] = Counter()
        self.unfired = Counter(kind for kind, _ in outages)
        self.errors: list[str] = []
        self._abort = abort
        self._thread: threading.Thread | None = None
        if apiserver is not None and outages:
            self._thread = threading.Thread(target=self._go, args=(apiserver, outages), daemon=True)
            self._thread.start()

    def _go(self, apiserver: Apiserver, outages: list[tuple[str, dict[str, Any]]]) -> None:
        for kind, o in outages:
            if self._abort.wait(o["after"]):
                return  # the campaign stopped: its cluster may be gone
            try:
                if o["apiserver"] == "pause":
                    apiserver.pause(o["seconds"])
                else:
                    apiserver.restart(o["seconds"])
            except Exception as e:  # noqa: BLE001 - the run's violation
                self.errors.append(f"{kind}: {e!r}")
                return
            self.fired[kind] += 1
            self.unfired[kind] -= 1

    def join(self) -> tuple[Counter[str], Counter[str], list[str]]:
        """(fired, not fired, errors), once every fault was carried out."""
        if self._thread is not None:
            self._thread.join()
        return self.fired, +self.unfired, self.errors


@contextmanager
def local_cluster(workdir: Path, needs: frozenset[str] = frozenset()) -> Iterator[Any]:
    """A local cluster of its own (2 nodes, CRD installed): a localkube Cluster. With the
    scenarios' `needs` (campaign_scenarios): KUEUE runs Kueue's manager (its CRDs and
    webhooks) beside it; SKEWED_NODES adds two tainted nodes with clocks of their own (an
    hour ahead, six hours behind). Only then: the other runs do not pay for them."""
    from campaign_scenarios import CLOCK_LABEL, CLOCK_SKEWS, CLOCK_TAINT, EXTERNAL_FRAMEWORK
    from localkube.components import NodeSpec, default_nodes
    from localkube.controlplane import Cluster
    from localkube.kueue import Kueue
    from localkube.testing import pick_base, unique_cluster_name
    from operator_fixtures import install_crd

    nodes = default_nodes(2, cpu="8", memory="32Gi", gpus=0)
    if SKEWED_NODES in needs:
        nodes += [
            NodeSpec(f"node-{clock}", labels={CLOCK_LABEL: clock}, taints=[CLOCK_TAINT],
                     clock_skew_seconds=skew)
            for clock, skew in CLOCK_SKEWS.items()
        ]  # fmt: skip
    cluster = Cluster(
        workdir / "cluster", name=unique_cluster_name("fr"), base=pick_base(),
        nodes=nodes, die_with_parent=True,
    )  # fmt: skip
    kueue: Kueue | None = None
    try:
        cluster.up(timeout=180)
        install_crd(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
        if KUEUE in needs:
            (workdir / "kueue").mkdir(exist_ok=True)
            kueue = Kueue(cluster, workdir / "kueue", [EXTERNAL_FRAMEWORK]).start()
        yield cluster
    finally:
        if kueue is not None:
            kueue.stop()
        cluster.down()


@contextmanager
def cluster_for(
    kubeconfig: Path | None, workdir: Path, scenarios: list[Scenario] | None = None
) -> Iterator[tuple[Path, Apiserver | None]]:
    """The cluster given (it must have what the scenarios need), or one of our own with
    what they need (then also its apiserver: the campaign may stop or restart it). A kind
    cluster of this host given comes with its apiserver too (KindApiserver)."""
    if kubeconfig is not None:
        container = kind_control_plane(kubeconfig)
        yield kubeconfig, KindApiserver(kubeconfig, container) if container else None
    else:
        with local_cluster(workdir, needs_of(scenarios or [])) as cluster:
            yield Path(cluster.kubeconfig), Apiserver(cluster)
