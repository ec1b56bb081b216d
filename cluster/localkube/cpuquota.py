"""A slow control plane on purpose: some of a local cluster's components (by default
kube-apiserver and etcd) moved into a CPU cgroup of their own with a quota, so that every
client of that cluster, whichever operator or controller it is, waits on the same slow
apiserver. A server-side slowness: nothing in any client is changed or told.

cgroup v1 (a `cpu` hierarchy, /sys/fs/cgroup/cpu: cpu.cfs_quota_us over cpu.cfs_period_us)
or v2 (cpu.max), whichever is mounted; needs root. The components' processes (every thread:
cgroup.procs moves a whole process) go in by PID, from the cluster's pids.json; on close each
goes back to the cgroup it came from and the cgroup is removed. A component restarted while
the quota holds (Cluster.restart_component) starts outside it: call add() with its new PID.

    with control_plane_quota(cluster, cpus=0.1) as quota:
        ...  # every request to the cluster is slow
        quota.throttled()  # how often the quota held them back

Used by the tests (tests/bench/test_slow_control_plane.py) and meant for the scale
benchmark's slow-control-plane runs (bench/README.md).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localkube.controlplane import Cluster

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The kernel's default CFS period. The quota is spent in slices of it: at 0.1 CPU a component
# runs 10 ms and then waits 90 ms, so a request that needs more CPU than one slice waits out
# whole periods, which is what makes it slow rather than only less frequent.
PERIOD_US = 100_000
# The two that every request passes through: the apiserver and its store.
SLOWED = ("etcd", "kube-apiserver")
# Kubernetes' own node timings (kube-controller-manager's --node-monitor-grace-period, the
# apiserver's default not-ready/unreachable tolerations), for a cluster that is to be slowed:
# localkube's are short (components.NODE_MONITOR_GRACE, DEFAULT_TOLERATION_SECONDS: 20 s and
# 30 s, so that tests of lost nodes are quick), and a node's heartbeat (KWOK's Lease renewal)
# goes through the slow apiserver too: late by more than 20 s, every node is taken for lost
# and its pods are evicted 30 s later, a failure of the nodes rather than the slowness asked.
# A Cluster subclass appends these in its _launch (the last of a repeated flag wins).
UPSTREAM_NODE_FLAGS: dict[str, list[str]] = {
    "kube-apiserver": [
        "--default-not-ready-toleration-seconds=300",
        "--default-unreachable-toleration-seconds=300",
    ],
    "kube-controller-manager": ["--node-monitor-grace-period=50s"],
}
# How long close() keeps trying to empty and remove the cgroup (a process that is exiting
# may linger in cgroup.procs for a moment).
REMOVE_TIMEOUT_SECONDS = 10.0


def cpu_hierarchy(root: Path = CGROUP_ROOT) -> tuple[Path, bool]:
    """Where the cpu controller's cgroups live, and whether it is cgroup v2."""
    if (root / "cgroup.controllers").exists():
        return root, True
    v1 = root / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        return v1, False
    raise RuntimeError(f"no cpu cgroup controller under {root} (neither v2 nor a v1 'cpu')")


def _own_cgroup(pid: int, v2: bool) -> str:
    """The cgroup `pid` is in, relative to the hierarchy's mount (/proc/PID/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v2 and controllers == "") or (not v2 and "cpu" in controllers.split(",")):
            return path
    return "/"


@dataclass(frozen=True)
class Throttling:
    """The cgroup's cpu.stat: CFS periods it ran in, how many of them its quota ran out in,
    and the time its processes were held back for it."""

    periods: int
    throttled_periods: int
    throttled_seconds: float


class CpuQuota:
    """One cpu cgroup with a quota of `cpus` CPUs (0.25: a quarter of one CPU, for all its
    processes together), holding the processes added to it."""

    def __init__(self, cpus: float, name: str = "localkube-slow", root: Path = CGROUP_ROOT):
        self.hierarchy, self.v2 = cpu_hierarchy(root)
        if self.v2:
            controllers = (self.hierarchy / "cgroup.subtree_control").read_text().split()
            if "cpu" not in controllers:
                (self.hierarchy / "cgroup.subtree_control").write_text("+cpu")
        self.path = self.hierarchy / f"{name}-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        self.origins: dict[int, str] = {}  # pid -> the cgroup it came from
        self.set(cpus)

    def set(self, cpus: float) -> None:
        """Changes the quota; the processes inside stay."""
        if cpus <= 0:
            raise ValueError(f"a quota of {cpus} CPUs")
        quota = max(1000, int(cpus * PERIOD_US))  # the kernel's smallest is 1 ms
        if self.v2:
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        self.cpus = cpus

    def add(self, pid: int) -> None:
        """Moves a process (all its threads; its children from now on) in."""
        self.origins.setdefault(pid, _own_cgroup(pid, self.v2))
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def throttled(self) -> Throttling:
        stat = dict(
            (k, int(v))
            for k, v in (line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        )
        held = stat["throttled_usec"] / 1e6 if self.v2 else stat["throttled_time"] / 1e9
        return Throttling(stat["nr_periods"], stat["nr_throttled"], held)

    def close(self) -> None:
        """Every process back where it came from (the hierarchy's root for one that came
        from elsewhere or is unknown), then the cgroup removed."""
        deadline = time.monotonic() + REMOVE_TIMEOUT_SECONDS
        while True:
            for pid in self.pids():
                origin = self.hierarchy / self.origins.get(pid, "/").lstrip("/")
                with contextlib.suppress(OSError):  # gone, or its origin is
                    (origin / "cgroup.procs").write_text(str(pid))
                with contextlib.suppress(OSError):
                    (self.hierarchy / "cgroup.procs").write_text(str(pid))
            try:
                os.rmdir(self.path)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@contextlib.contextmanager
def control_plane_quota(
    cluster: Cluster, cpus: float, components: Iterable[str] = SLOWED
) -> Iterator[CpuQuota]:
    """`components` of a running `cluster` held to `cpus` CPUs together until the block
    ends; then restored to their own cgroups."""
    status = cluster.status()["components"]
    wanted = list(components)
    missing = [c for c in wanted if not (status.get(c) or {}).get("running")]
    if missing:
        raise RuntimeError(f"{missing} of the cluster in {cluster.dir} are not running")
    quota = CpuQuota(cpus, name=f"localkube-{cluster.name}-slow")
    try:
        for c in wanted:
            quota.add(int(status[c]["pid"]))
        yield quota
    finally:
        quota.close()
