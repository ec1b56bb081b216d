"""A loaded node: the processes of a test's training in a CPU cgroup of their own, with a
quota and a CPU hog inside it. A GPU node's CPUs are busy (data loading), and a Python
process that has raised can take seconds to exit; the status's promises must hold there, not
only on an idle machine. The starvation is the test's alone: the rest of the machine (the
other test workers' clusters) keeps its CPUs.

The cgroup is localkube.cpuquota's (v1 or v2, whichever is mounted). Processes
join by PID (`add`), or by pod: `follow` moves a job's launchers and workers in as they
appear (found from /proc: hostprocs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hostprocs
import pytest
from localkube.cpuquota import CpuQuota

# The training's share: one CPU for the test's processes and the hog together, so they get
# about half of one CPU while the hog runs (a node whose loader threads keep its cores busy).
QUOTA_CPUS = 1.0
HOG = "while True: pass"
FOLLOW_PERIOD = 0.2


class LoadedNode:
    """A CPU cgroup with a quota (localkube.cpuquota, the one cgroup mechanism), the hogs and
    the processes that joined it."""

    def __init__(self, quota_cpus: float = QUOTA_CPUS) -> None:
        self.quota = CpuQuota(quota_cpus, name="torchrun-operator-loaded")
        self._hogs: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.joined: set[int] = set()

    def add(self, pid: int) -> bool:
        """Move a process (its threads, and the children it starts from now on) in."""
        try:
            self.quota.add(pid)
        except OSError:
            return False  # gone already
        self.joined.add(pid)
        return True

    def prefix(self) -> list[str]:
        """A command prefix that runs a command inside: it joins, then execs it."""
        procs = self.quota.path / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "loaded-node"]

    def hog(self, processes: int = 2) -> None:
        """Busy loops inside the cgroup, competing with the training for its quota."""
        for _ in range(processes):
            p = subprocess.Popen([sys.executable, "-c", HOG])
            self._hogs.append(p)
            self.add(p.pid)

    def follow(self, pods: Any) -> None:
        """Move the launchers and workers of `pods()` (a callable listing V1Pods) in as they
        appear, until close."""

        def run() -> None:
            while not self._stop.wait(FOLLOW_PERIOD):
                try:
                    listed = pods()
                except Exception:  # noqa: BLE001 - a missed round is tried again
                    continue
                for pod in listed:
                    launcher = hostprocs.launcher_pid(pod)
                    if launcher is None:
                        continue
                    for pid in [launcher, *hostprocs.worker_pids(launcher).values()]:
                        if pid not in self.joined:
                            self.add(pid)

        t = threading.Thread(target=run, daemon=True, name="loaded-node-follow")
        t.start()
        self._threads.append(t)

    def hog_seconds(self) -> float:
        """CPU seconds the hogs took from the training's share so far (the proof it was
        loaded; the quota itself binds only where the rest of the machine leaves it room)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for p in self._hogs:
            try:
                fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        return total

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        for p in self._hogs:
            p.kill()
            p.wait()
        self.quota.close()


@pytest.fixture
def loaded_node() -> Iterator[LoadedNode]:
    node = LoadedNode()
    try:
        yield node
    finally:
        node.close()
