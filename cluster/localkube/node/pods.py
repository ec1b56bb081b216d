"""The pod sync loop: one watch per node feeds one worker thread per pod.

Files (all under STATE_DIR):
  pods/<namespace>_<pod>_<uid>/<container>.log     stdout+stderr of the latest run of a
                                                   container; earlier runs are kept as
                                                   <container>.<restart>.log
  logs/<namespace>/<pod>/<container>.log           symlink to the latest run of the latest
                                                   pod with that name (stable for tests)
  pods/<namespace>_<pod>_<uid>/volumes/<volume>/   materialised volumes (removed at teardown)
  pods/<namespace>_<pod>_<uid>/termination/<c>     the host file behind terminationMessagePath

Pods bound to our nodes that have a pod IP but no worker in this process were started by an
earlier run of the node: their processes are gone, so they are marked Failed with reason
`NodeRestarted` (a real kubelet would restart their containers; ours cannot adopt them).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from . import kapi, logserver, status, volumes
from .env import ConfigError, PodFacts, container_argv, container_env
from .hostpaths import CreatedPaths
from .logserver import LogQuery
from .nodes import NodeConfig, dead_marker, now_rfc3339
from .probes import ProbeTracker, run_probe
from .runtime import ContainerProcess, Sandbox

log = logging.getLogger(__name__)
TICK = 0.2
MAX_MESSAGE = 4096


@dataclass
class NodeContext:
    api: client.ApiClient
    state_dir: Path
    bridge: str
    base: int
    dns_ip: str
    api_host: str
    api_port: int
    backoff_base: float
    backoff_cap: float
    created: CreatedPaths
    stop: threading.Event
    ipam: Ipam

    @property
    def gateway(self) -> str:
        return f"10.{self.base}.0.1"

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def kubelet_dead(self, node: str) -> bool:
        """Whether a test has made `node`'s kubelet gone (nodes.dead_marker)."""
        return dead_marker(self.state_dir, node).exists()


class Ipam:
    """Pod IPs: node i hands out 10.<base>.<i+1>.2..254."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.used: dict[str, str] = {}  # ip -> uid
        self.lock = threading.Lock()

    def allocate(self, index: int, uid: str) -> str:
        with self.lock:
            for ip, owner in self.used.items():
                if owner == uid:
                    return ip
            for host in range(2, 255):
                ip = f"10.{self.base}.{index + 1}.{host}"
                if ip not in self.used:
                    self.used[ip] = uid
                    return ip
        raise RuntimeError(f"node {index}: no free pod IP")

    def reserve(self, ip: str, uid: str) -> None:
        with self.lock:
            self.used.setdefault(ip, uid)

    def release(self, uid: str) -> None:
        with self.lock:
            for ip in [ip for ip, owner in self.used.items() if owner == uid]:
                del self.used[ip]


@dataclass
class ContainerRun:
    spec: dict[str, Any]
    image: str
    proc: ContainerProcess | None = None
    state: status.State = "waiting"
    reason: str | None = "ContainerCreating"
    message: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    restart_count: int = 0
    runs: int = 0
    last_terminated: dict[str, Any] | None = None
    next_start: float = 0.0
    kill_at: float | None = None
    readiness: ProbeTracker | None = None
    liveness: ProbeTracker | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def observed(self) -> status.Observed:
        ready = self.state == "running" and (
            self.readiness is None or self.readiness.healthy is True
        )
        cid = f"localkube://{self.proc.proc.pid}" if self.proc else None
        return status.Observed(
            name=self.name,
            image=self.image,
            state=self.state,
            reason=self.reason,
            message=self.message,
            exit_code=self.exit_code,
            signal=self.signal,
            started_at=self.started_at,
            finished_at=self.finished_at,
            restart_count=self.restart_count,
            ready=ready,
            container_id=cid,
            last_terminated=self.last_terminated,
        )


# A kubelet sends its final delete until the apiserver takes it: an apiserver restart (15 s
# down in the fault campaign) outlasts kapi.retry's back-off, and a pod whose delete was
# given up on stays Terminating in the API for ever, holding its job's next attempt.
FINAL_DELETE_RETRY_SECONDS = 2.0


def delete_pod(ctx: NodeContext, ns: str, name: str, uid: str, node: str | None = None) -> None:
    """The kubelet's last word on a pod: remove it now, but only this incarnation of it;
    sent again while the apiserver cannot be reached or answers 5xx, until the node stops.
    Not while `node`'s kubelet is dead (nodes.py): then once it is back."""
    body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
    while True:
        if node is not None and ctx.kubelet_dead(node):
            if ctx.stop.wait(FINAL_DELETE_RETRY_SECONDS):
                return
            continue
        try:
            kapi.retry(
                lambda: kapi.raw(ctx.core.delete_namespaced_pod, name, ns, body=body),
                f"delete pod {ns}/{name}",
                ok_statuses=(404, 409),
                stop=ctx.stop.is_set,
            )
            return
        except ApiException as e:
            if e.status is not None and e.status < 500:
                log.warning("pod %s/%s: final delete failed: %s", ns, name, e)
                return
            log.warning("pod %s/%s: final delete failed (%s), will retry", ns, name, e.status)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            log.warning("pod %s/%s: final delete not sent (%s), will retry", ns, name, e)
        if ctx.stop.wait(FINAL_DELETE_RETRY_SECONDS):
            return


class PodWorker(threading.Thread):
    def __init__(
        self,
        ctx: NodeContext,
        node: NodeConfig,
        pod: dict[str, Any],
        on_done: Callable[[str], None],
    ) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.ctx, self.node, self.pod = ctx, node, pod
        self.uid: str = meta["uid"]
        self.ns: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.on_done = on_done
        self.wake = threading.Event()
        self.vanished = False
        self.pod_dir = ctx.state_dir / "pods" / f"{self.ns}_{self.pod_name}_{self.uid}"
        spec = pod["spec"]
        self.init = [ContainerRun(c, c.get("image", "")) for c in spec.get("initContainers") or []]
        self.containers = [ContainerRun(c, c.get("image", "")) for c in spec["containers"]]
        self.policy: str = spec.get("restartPolicy", "Always")
        self.pod_ip: str | None = None
        self.start_time: str | None = None
        self.sandbox: Sandbox | None = None
        self.vols: volumes.PodVolumes | None = None
        self.published: dict[str, Any] | None = None
        self.deleting_since: float | None = None
        self.extra: dict[str, Any] = {}

    # -- inputs from the sync loop ----------------------------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.wake.set()

    def gone(self) -> None:
        self.vanished = True
        self.wake.set()

    # -- main loop --------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception:
            log.exception("pod %s/%s: worker crashed", self.ns, self.pod_name)
            self._kill_all(signal.SIGKILL)
        finally:
            self._teardown()
            self.on_done(self.uid)

    def _run(self) -> None:
        self.start_time = now_rfc3339(self.node.clock_skew_seconds)
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        self.pod_ip = self.ctx.ipam.allocate(self.node.index, self.uid)
        self.sandbox = Sandbox(self.ctx.bridge, self.uid, self.pod_ip, self.ctx.gateway)
        self.sandbox.create()
        self._write_dns_files()
        self._publish()
        while True:
            if self.ctx.stop.is_set():
                self._kill_all(signal.SIGKILL)
                return
            if self._deleting():
                if self._terminate_step():
                    self._finish_deletion()
                    return
            else:
                self._step()
                if status.phase(self._observation()) in ("Succeeded", "Failed"):
                    # The final status must reach the apiserver, however long it is down:
                    # nothing else would ever end the pod in the API.
                    while not self._publish() and not self.ctx.stop.is_set():
                        self.wake.wait(TICK * 10)
                        self.wake.clear()
                    return
            self._publish()
            self.wake.wait(TICK)
            self.wake.clear()

    def _deleting(self) -> bool:
        return self.vanished or bool(self.pod["metadata"].get("deletionTimestamp"))

    # -- facts, env -------------------------------------------------------------------------
    def _facts(self) -> PodFacts:
        return PodFacts(
            pod_ip=self.pod_ip or "",
            host_ip=self.ctx.gateway,
            node_allocatable=self.node.capacity(),
        )

    def _hostname(self) -> str:
        return str(self.pod["spec"].get("hostname") or self.pod_name)[:63]

    def _lookup(self, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        core = self.ctx.core
        fn = core.read_namespaced_config_map if kind == "ConfigMap" else core.read_namespaced_secret
        try:
            return kapi.retry(lambda: kapi.raw(fn, name, ns), f"read {kind} {ns}/{name}")
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _token(self, sa: str, audience: str | None, expiration: int) -> str:
        spec: dict[str, Any] = {
            "expirationSeconds": max(600, expiration),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": self.pod_name,
                "uid": self.uid,
            },
        }
        if audience:
            spec["audiences"] = [audience]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        try:
            res = kapi.retry(
                lambda: kapi.raw(
                    self.ctx.core.create_namespaced_service_account_token, sa, self.ns, body
                ),
                f"token for {self.ns}/{sa}",
            )
        except ApiException as e:
            raise ConfigError(f"TokenRequest for serviceaccount {sa!r} failed: {e.reason}") from e
        return str((res or {})["status"]["token"])

    def _base_env(self) -> dict[str, str]:
        host, port = self.ctx.api_host, str(self.ctx.api_port)
        return {
            # The folder resolved, not the python: a venv reached through a symlink under /tmp
            # (a CI clone's .venv) would be hidden by a pod's /tmp emptyDir.
            "PATH": f"{os.path.realpath(os.path.dirname(sys.executable))}:"
            f"{os.environ.get('PATH', os.defpath)}",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "HOSTNAME": self._hostname(),
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
            f"KUBERNETES_PORT_{port}_TCP": f"tcp://{host}:{port}",
        }

    def _write_dns_files(self) -> None:
        spec = self.pod["spec"]
        (self.pod_dir / "resolv.conf").write_text(
            f"nameserver {self.ctx.dns_ip}\n"
            f"search {self.ns}.svc.cluster.local svc.cluster.local cluster.local\n"
            "options ndots:5\n"
        )
        hostname = self._hostname()
        names = [hostname]
        if spec.get("subdomain"):
            names.insert(0, f"{hostname}.{spec['subdomain']}.{self.ns}.svc.cluster.local")
        lines = [
            "# Kubernetes-managed hosts file (localkube).",
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            f"{self.pod_ip}\t{' '.join(names)}",
        ]
        for alias in spec.get("hostAliases") or []:
            lines.append(f"{alias['ip']}\t{' '.join(alias.get('hostnames') or [])}")
        (self.pod_dir / "hosts").write_text("\n".join(lines) + "\n")

    # -- container lifecycle ----------------------------------------------------------------
    def _step(self) -> None:
        now = time.time()
        if self.vols is None:
            try:
                self.vols = volumes.prepare(
                    self.pod, self.pod_dir, self._facts(), self._lookup, self._token
                )
            except (ConfigError, OSError) as e:
                for c in self.init + self.containers:
                    c.reason, c.message = "CreateContainerConfigError", str(e)
                return
            except (ApiException, urllib3.exceptions.HTTPError) as e:
                # The apiserver is away (restarted): a kubelet retries its volume set-up
                # until it is back; this worker used to crash and leave the pod Pending.
                for c in self.init + self.containers:
                    c.reason, c.message = "ContainerCreating", f"volume set-up: {e}"[:300]
                return
        for c in self.init:
            if c.state == "terminated" and c.exit_code == 0:
                continue
            self._drive(c, now, is_init=True)
            return  # init containers run one at a time, in order
        for c in self.containers:
            self._drive(c, now, is_init=False)

    def _drive(self, c: ContainerRun, now: float, is_init: bool) -> None:
        if c.proc is not None and c.state == "running":
            st = c.proc.poll()
            if st is not None:
                self._on_exit(c, st, is_init)
            else:
                self._probe(c, now)
                if c.kill_at is not None and now >= c.kill_at:
                    c.proc.signal(signal.SIGKILL)
            return
        if c.state == "terminated":
            policy = "OnFailure" if is_init and self.policy == "Always" else self.policy
            if not status.should_restart(policy, c.exit_code or 0):
                return
            delay = status.backoff_seconds(c.runs, self.ctx.backoff_base, self.ctx.backoff_cap)
            c.next_start = now + delay
            c.last_terminated = status.state_dict(c.observed())["terminated"]
            c.state, c.reason, c.message = (
                "waiting",
                "CrashLoopBackOff",
                (
                    f"back-off {delay:g}s restarting failed container={c.name} "
                    f"pod={self.pod_name}_{self.ns}({self.uid})"
                ),
            )
        if now >= c.next_start:
            self._start(c)

    def _start(self, c: ContainerRun) -> None:
        assert self.vols is not None and self.sandbox is not None
        try:
            c.env = container_env(self.pod, c.spec, self._facts(), self._lookup, self._base_env())
            argv = container_argv(c.spec, c.env)
            mounts = volumes.container_mounts(c.spec, self.vols)
        except (ConfigError, ApiException, OSError, urllib3.exceptions.HTTPError) as e:
            c.reason, c.message = "CreateContainerConfigError", str(e)[:300]
            c.next_start = time.time() + 1.0
            return
        term_file = self.pod_dir / "termination" / c.name
        term_file.parent.mkdir(parents=True, exist_ok=True)
        term_file.write_bytes(b"")
        mounts += [
            {
                "source": str(self.pod_dir / "resolv.conf"),
                "target": "/etc/resolv.conf",
                "file": True,
            },
            {"source": str(self.pod_dir / "hosts"), "target": "/etc/hosts", "file": True},
            {
                "source": str(term_file),
                "target": c.spec.get("terminationMessagePath") or "/dev/termination-log",
                "file": True,
            },
        ]
        mounts.sort(key=lambda m: len(Path(m["target"]).parts))
        cwd = c.spec.get("workingDir") or "/"
        for m in mounts:
            self.ctx.created.ensure(m["target"], bool(m.get("file")))
        self.ctx.created.ensure(cwd, False)
        log_path = self.pod_dir / f"{c.name}.log"
        if c.runs > 0 and log_path.exists():
            log_path.rename(self.pod_dir / f"{c.name}.{c.runs - 1}.log")
        spec = {
            "netns": self.sandbox.netns_path,
            "hostname": self._hostname(),
            "argv": argv,
            "env": c.env,
            "cwd": cwd,
            "mounts": mounts,
        }
        c.proc = ContainerProcess(spec, self.pod_dir / "run" / c.name, log_path)
        self._link_log(c.name, log_path)
        if c.runs > 0:
            c.restart_count += 1
        c.runs += 1
        c.state, c.reason, c.message = "running", None, None
        c.exit_code = c.signal = None
        c.started_at, c.finished_at, c.kill_at = (
            now_rfc3339(self.node.clock_skew_seconds),
            None,
            None,
        )
        started = time.time()
        for kind in ("readinessProbe", "livenessProbe"):
            probe = c.spec.get(kind)
            tracker = ProbeTracker(probe, started) if probe else None
            if kind == "readinessProbe":
                c.readiness = tracker
            else:
                c.liveness = tracker

    def _link_log(self, name: str, target: Path) -> None:
        link = self.ctx.state_dir / "logs" / self.ns / self.pod_name / f"{name}.log"
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)

    def _on_exit(self, c: ContainerRun, st: Any, is_init: bool) -> None:
        c.proc.reap() if c.proc else None
        c.state, c.finished_at = "terminated", now_rfc3339(self.node.clock_skew_seconds)
        c.exit_code, c.signal = st.exit_code, st.signal
        c.reason = "StartError" if st.start_error else status.terminated_reason(st.exit_code)
        message = st.start_error or self._termination_message(c)
        c.message = message or None

    def _termination_message(self, c: ContainerRun) -> str:
        try:
            with open(self.pod_dir / "termination" / c.name, "rb") as f:
                data = f.read(MAX_MESSAGE)
        except OSError:
            data = b""
        if (
            not data.strip()
            and c.exit_code
            and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        ):
            try:
                lines = (self.pod_dir / f"{c.name}.log").read_bytes().splitlines()[-80:]
                data = b"\n".join(lines)[-2048:]
            except OSError:
                data = b""
        return data.decode(errors="replace")

    def _probe(self, c: ContainerRun, now: float) -> None:
        pid = c.proc.main_pid() if c.proc else None
        for tracker in (c.readiness, c.liveness):
            if tracker is None or not tracker.due(now):
                continue
            ok = run_probe(tracker.probe, c.spec, self.pod_ip or "", pid, c.env)
            tracker.record(ok, time.time())
        if c.liveness is not None and c.liveness.healthy is False and c.kill_at is None:
            log.info("pod %s/%s: liveness failed, killing %s", self.ns, self.pod_name, c.name)
            if c.proc:
                c.proc.signal(signal.SIGTERM)
            c.kill_at = now + float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))

    # -- deletion ---------------------------------------------------------------------------
    def _terminate_step(self) -> bool:
        """Advance graceful termination; True once every container has stopped."""
        now = time.time()
        meta = self.pod["metadata"]
        if self.vanished:
            grace = 0.0
        else:
            grace = float(
                meta.get(
                    "deletionGracePeriodSeconds",
                    self.pod["spec"].get("terminationGracePeriodSeconds", 30),
                )
            )
        first = self.deleting_since is None
        if first:
            self.deleting_since = now
        assert self.deleting_since is not None
        deadline = self.deleting_since + grace
        alive = False
        for c in self.init + self.containers:
            if c.proc is None or c.state != "running":
                if c.state == "waiting":  # never to run again
                    c.state, c.exit_code, c.reason = "terminated", 137, "ContainerStatusUnknown"
                    c.finished_at = now_rfc3339(self.node.clock_skew_seconds)
                continue
            st = c.proc.poll()
            if st is not None:
                self._on_exit(c, st, c in self.init)
                continue
            alive = True
            if first:
                c.proc.signal(signal.SIGTERM)
            if now >= deadline:
                c.proc.signal(signal.SIGKILL)
        return not alive

    def _finish_deletion(self) -> None:
        if self.vanished:
            return
        self._publish(final=True)
        delete_pod(self.ctx, self.ns, self.pod_name, self.uid, self.node.name)

    def _kill_all(self, sig: int) -> None:
        for c in self.init + self.containers:
            if c.proc is not None and c.proc.proc.poll() is None:
                c.proc.signal(sig)
        for c in self.init + self.containers:
            if c.proc is not None:
                c.proc.reap()

    def _teardown(self) -> None:
        self._kill_all(signal.SIGKILL)
        if self.vols is not None:
            self.vols.teardown()
        if self.sandbox is not None:
            self.sandbox.destroy()
        self.ctx.ipam.release(self.uid)
        shutil.rmtree(self.pod_dir / "volumes", ignore_errors=True)
        shutil.rmtree(self.pod_dir / "run", ignore_errors=True)

    # -- status -----------------------------------------------------------------------------
    def _observation(self, final: bool = False) -> status.PodObservation:
        return status.PodObservation(
            init=[c.observed() for c in self.init],
            containers=[c.observed() for c in self.containers],
            now=now_rfc3339(self.node.clock_skew_seconds),
            restart_policy=self.policy,
            pod_ip=self.pod_ip,
            host_ip=self.ctx.gateway,
            start_time=self.start_time,
            sandbox_ready=self.sandbox is not None,
            final=final,
            extra=self.extra,
        )

    def _publish(self, final: bool = False) -> bool:
        """Sends the pod's status if it changed; False when the apiserver could not be
        reached (restarted, down): the status stays unpublished, to be sent again."""
        if self.vanished:
            return True
        if self.ctx.kubelet_dead(self.node.name):
            return False  # a dead kubelet sends nothing; sent once it is back
        watched = dict(self.pod.get("status") or {})
        own = set(status.OWN_CONDITIONS)
        if self.published is not None:  # our own conditions: trust what we wrote last
            watched["conditions"] = [
                c for c in watched.get("conditions") or [] if c.get("type") not in own
            ] + [c for c in self.published["conditions"] if c["type"] in status.OWN_CONDITIONS]
        new = status.pod_status(watched, self._observation(final))
        if new == self.published:
            return True
        patch = [{"op": "replace", "path": "/status", "value": new}]
        try:
            kapi.retry(
                lambda: self.ctx.core.patch_namespaced_pod_status(
                    self.pod_name, self.ns, patch, _content_type=kapi.JSON_PATCH
                ),
                f"status of {self.ns}/{self.pod_name}",
                stop=self.ctx.stop.is_set,
            )
            self.published = new
        except ApiException as e:
            if e.status == 404:
                self.gone()
            else:
                log.warning(
                    "pod %s/%s: status patch failed: %s",
                    self.ns,
                    self.pod_name,
                    e.body if hasattr(e, "body") else e,
                )
                return e.status is None or e.status < 500  # a 5xx: sent again
        except (urllib3.exceptions.HTTPError, OSError) as e:
            log.warning("pod %s/%s: status not sent (%s), will retry", self.ns, self.pod_name, e)
            return False
        return True


class PodManager:
    """Watches the pods bound to our nodes and keeps one worker per live pod."""

    def __init__(self, ctx: NodeContext, nodes: list[NodeConfig]) -> None:
        self.ctx, self.nodes = ctx, nodes
        self.workers: dict[str, PodWorker] = {}
        self.done: set[str] = set()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(
                target=self._watch_loop, args=(n,), daemon=True, name=f"watch-{n.name}"
            )
            for n in nodes
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _finished(self, uid: str) -> None:
        with self.lock:
            self.workers.pop(uid, None)
            self.done.add(uid)

    def handle(self, node: NodeConfig, pod: dict[str, Any]) -> None:
        """Level-triggered: decide what to do from the pod as it is now."""
        meta, st = pod["metadata"], pod.get("status") or {}
        uid = meta["uid"]
        with self.lock:
            worker = self.workers.get(uid)
            if worker is not None:
                worker.update(pod)
                return
            if uid in self.done or st.get("phase") in ("Succeeded", "Failed"):
                return
            if meta.get("deletionTimestamp") and not st.get("podIP"):
                self.done.add(uid)
                threading.Thread(target=self._delete_now, args=(pod,), daemon=True).start()
                return
            if st.get("podIP"):
                self.done.add(uid)
                threading.Thread(target=self._mark_restarted, args=(node, pod), daemon=True).start()
                return
            worker = PodWorker(self.ctx, node, pod, self._finished)
            self.workers[uid] = worker
        worker.start()

    def vanished(self, node: NodeConfig, live: set[str]) -> None:
        with self.lock:
            for uid, w in self.workers.items():
                if w.node.name == node.name and uid not in live:
                    w.gone()

    def _delete_now(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        node = (pod.get("spec") or {}).get("nodeName")
        delete_pod(self.ctx, meta["namespace"], meta["name"], meta["uid"], node)

    def _mark_restarted(self, node: NodeConfig, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        st = dict(pod.get("status") or {})
        now = now_rfc3339(node.clock_skew_seconds)
        st.update(
            phase="Failed",
            reason="NodeRestarted",
            message="the localkube node process restarted; the pod's processes are gone",
        )
        for key in ("containerStatuses", "initContainerStatuses"):
            for cs in st.get(key) or []:
                if "terminated" not in (cs.get("state") or {}):
                    cs["state"] = {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "NodeRestarted",
                            "finishedAt": now,
                        }
                    }
                    cs["ready"] = cs["started"] = False
        for c in st.get("conditions") or []:
            if c.get("type") in ("Ready", "ContainersReady") and c.get("status") == "True":
                c.update(status="False", reason="PodCompleted", lastTransitionTime=now)
        patch = [{"op": "replace", "path": "/status", "value": st}]
        try:
            kapi.retry(
                lambda: self.ctx.core.patch_namespaced_pod_status(
                    meta["name"], meta["namespace"], patch, _content_type=kapi.JSON_PATCH
                ),
                "mark restarted",
                ok_statuses=(404,),
            )
        except ApiException as e:
            log.warning("marking %s NodeRestarted failed: %s", meta["name"], e)

    def _watch_loop(self, node: NodeConfig) -> None:
        core = self.ctx.core
        selector = f"spec.nodeName={node.name}"
        delay = 0.5
        while not self.ctx.stop.is_set():
            if self.ctx.kubelet_dead(node.name):  # it hears of nothing (nodes.py)
                self.ctx.stop.wait(1.0)
                continue
            try:
                listing = kapi.raw(core.list_pod_for_all_namespaces, field_selector=selector)
                items = listing.get("items") or []
                for pod in items:
                    self.handle(node, pod)
                self.vanished(node, {p["metadata"]["uid"] for p in items})
                rv = listing["metadata"]["resourceVersion"]
                w = watch.Watch()
                for event in w.stream(
                    core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=rv,
                    timeout_seconds=30,
                    allow_watch_bookmarks=False,
                ):
                    if self.ctx.stop.is_set() or self.ctx.kubelet_dead(node.name):
                        w.stop()
                        break
                    obj = event["raw_object"]
                    if event["type"] == "ERROR":
                        break
                    if event["type"] == "DELETED":
                        with self.lock:
                            wk = self.workers.get(obj["metadata"]["uid"])
                        if wk is not None:
                            wk.gone()
                    else:
                        self.handle(node, obj)
                delay = 0.5
            except Exception as e:
                if self.ctx.stop.is_set():
                    return
                log.warning("watch of pods on %s failed: %s", node.name, e)
                self.ctx.stop.wait(delay)
                delay = min(delay * 2, 10.0)

    def find_log(self, query: LogQuery) -> tuple[Path, Callable[[], bool]] | str:
        """The log file `kubectl logs` asks for, and whether its container still runs
        (localkube.node.logserver); or why there is none. A pod whose worker has ended is
        found through its logs/ link, as long as no later pod of its name replaced it."""
        ns, name, cname = query.namespace, query.pod, query.container
        with self.lock:
            worker = next(
                (w for w in self.workers.values() if (w.ns, w.pod_name) == (ns, name)), None
            )
        run: ContainerRun | None = None
        if worker is not None:
            pod_dir = worker.pod_dir
            run = next((c for c in worker.init + worker.containers if c.name == cname), None)
            if run is None:
                return f"container {cname} is not valid for pod {name}"
        else:
            link = self.ctx.state_dir / "logs" / ns / name / f"{cname}.log"
            if not link.is_symlink():
                return f"no log of container {cname} of pod {ns}/{name} on this node"
            pod_dir = Path(os.readlink(link)).parent
        if query.previous:
            earlier = logserver.previous_log(pod_dir, cname)
            if earlier is None:
                return f"previous terminated container {cname} in pod {name} not found"
            return earlier, lambda: False
        if run is not None and run.proc is None:
            return f"container {cname} in pod {name} is waiting to start: {run.reason}"
        proc = run.proc if run is not None else None

        def running() -> bool:
            return run is not None and run.proc is proc and run.state == "running"

        return pod_dir / f"{cname}.log", running

    def shutdown(self, timeout: float = 20.0) -> None:
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            w.wake.set()
        deadline = time.time() + timeout
        for w in workers:
            w.join(max(0.1, deadline - time.time()))
