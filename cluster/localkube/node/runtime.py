"""Thin I/O: pod sandboxes (network namespace + veth into the cluster bridge) and container
processes (started through `localkube.node.shim`).

Names: the netns is `<bridge>-<uid[:12]>` (so `cleanup_stale(bridge)` finds leftovers of a
crashed run of the same cluster), the host end of the veth `lv<hash>` (15-char limit).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# So that `python -m localkube.node.shim` resolves to this very package.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res


def netns_name(bridge: str, uid: str) -> str:
    return f"{bridge}-{uid[:12]}"


def _veth(bridge: str, uid: str, side: str) -> str:
    return side + hashlib.sha1(f"{bridge}/{uid}".encode()).hexdigest()[:11]


@dataclass
class Sandbox:
    """A pod's network namespace with `eth0` = the pod IP, default route via the bridge."""

    bridge: str
    uid: str
    ip: str
    gateway: str
    prefix_len: int = 16

    @property
    def netns(self) -> str:
        return netns_name(self.bridge, self.uid)

    @property
    def netns_path(self) -> str:
        return f"/var/run/netns/{self.netns}"

    def create(self) -> None:
        self.destroy()
        host, peer = _veth(self.bridge, self.uid, "lv"), _veth(self.bridge, self.uid, "lp")
        ns = self.netns
        sh("ip", "netns", "add", ns)
        try:
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "netns", ns)
            sh("ip", "-n", ns, "link", "set", peer, "name", "eth0")
            sh("ip", "-n", ns, "addr", "add", f"{self.ip}/{self.prefix_len}", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", self.gateway)
            sh("ip", "link", "set", host, "master", self.bridge)
            sh("ip", "link", "set", host, "up")
        except Exception:
            self.destroy()
            raise

    def destroy(self) -> None:
        sh("ip", "netns", "del", self.netns, check=False)
        sh("ip", "link", "del", _veth(self.bridge, self.uid, "lv"), check=False)


def cleanup_stale(bridge: str) -> list[str]:
    """Remove network namespaces a previous run of this cluster's node left behind."""
    out = sh("ip", "netns", "list", check=False).stdout
    removed = []
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(bridge + "-"):
            sh("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed


@dataclass
class ExitStatus:
    exit_code: int
    signal: int | None
    start_error: str | None = None


class ContainerProcess:
    """One run of one container: the shim process and the container's PID 1."""

    def __init__(self, spec: dict[str, Any], run_dir: Path, log_path: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.pidfile = run_dir / "pid.json"
        self.statusfile = run_dir / "status.json"
        self.starterror = run_dir / "starterror"
        for f in (self.pidfile, self.statusfile, self.starterror):
            f.unlink(missing_ok=True)
        spec = dict(
            spec,
            pidfile=str(self.pidfile),
            statusfile=str(self.statusfile),
            starterror=str(self.starterror),
        )
        spec_path = run_dir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": _PACKAGE_ROOT}
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "localkube.node.shim", str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.started = time.time()

    def main_pid(self) -> int | None:
        """Host PID of the container's PID 1, once the shim has forked it."""
        try:
            return int(json.loads(self.pidfile.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None

    def wait_main_pid(self, timeout: float = 5.0) -> int | None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid = self.main_pid()
            if pid is not None or self.proc.poll() is not None:
                return pid
            time.sleep(0.02)
        return None

    def poll(self) -> ExitStatus | None:
        if self.proc.poll() is None:
            return None
        err = self.starterror.read_text() if self.starterror.exists() else None
        try:
            data = json.loads(self.statusfile.read_text())
            return ExitStatus(int(data["exitCode"]), data.get("signal"), err)
        except (OSError, ValueError, KeyError):
            rc = self.proc.returncode
            # The shim died before recording a status (killed): report it like a SIGKILL.
            if rc < 0:
                return ExitStatus(128 - rc, -rc, err)
            return ExitStatus(rc, None, err)

    def signal(self, sig: int) -> None:
        pid = self.main_pid()
        for target in ([pid] if pid else []) + [self.proc.pid]:
            if sig != signal.SIGKILL and target == self.proc.pid and pid:
                continue  # the shim forwards signals; PID 1 got it directly already
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, sig)

    def reap(self, timeout: float = 5.0) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(5)


def exec_in(
    pid: int, argv: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[bytes]:
    """Run a command inside a container's namespaces (exec probes). `-r`: also the
    container's root directory. Entering a mount namespace resets the root to that namespace's
    own, which is the container's only when the node itself runs unchrooted: in a chroot (the
    fresh-root check, hack/fresh-root.sh) every exec probe read the host's files instead, no
    trainer ever became Ready, and every test that waits for a Running job timed out there."""
    cmd = ["nsenter", "-t", str(pid), "-n", "-m", "-u", "-p", "-r", "--", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=timeout)
