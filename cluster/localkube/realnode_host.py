"""The host side of real nodes (localkube.realnode): their cgroup roots, containerd's images,
and what must go when a node stops (containers whose containerd is gone keep running)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from localkube import procs, sysdeps
from localkube.realnode import CRI_NAMESPACE, RealNodeLayout

CGROUP_V1 = Path("/sys/fs/cgroup")


def missing_packages() -> list[str]:
    """Debian packages real nodes need (the group "realnode" of hack/sysdeps/packages.tsv)
    that this host lacks."""
    return sorted(p.name for p in sysdeps.packages() if "realnode" in p.groups and not p.present())


def hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (cpu, memory, ..., name=systemd)."""
    if not CGROUP_V1.is_dir():
        return []
    return sorted(
        d
        for d in CGROUP_V1.iterdir()
        if d.is_dir() and not d.is_symlink() and (d / "cgroup.procs").exists()
    )


def create_cgroup_root(root: str) -> None:
    """The kubelet refuses a --cgroup-root that does not exist in every hierarchy. A new
    cpuset cgroup has no CPUs or memory nodes until given its parent's."""
    for h in hierarchies():
        d = h / root.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        if h.name == "cpuset":
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((h / f).read_text())


def _tree(d: Path) -> list[Path]:
    """d and every cgroup below it, deepest first."""
    found = [p for p in d.rglob("*") if p.is_dir()] + [d]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def remove_cgroup_root(root: str, timeout: float = 20.0) -> int:
    """Kills every process left under the node's cgroup root (its containers and their pause
    processes) and removes the cgroups. Returns how many processes it killed."""
    killed = 0
    deadline = time.monotonic() + timeout
    for h in hierarchies():
        d = h / root.lstrip("/")
        if not d.exists():
            continue
        while time.monotonic() < deadline:
            pids = set()
            for cg in _tree(d):
                with contextlib.suppress(OSError):
                    pids |= {int(p) for p in (cg / "cgroup.procs").read_text().split()}
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            time.sleep(0.1)
        for cg in _tree(d):
            with contextlib.suppress(OSError):
                cg.rmdir()
    return killed


def ctr(layout: RealNodeLayout, *args: str) -> list[str]:
    return ["ctr", "--address", str(layout.socket), "--namespace", CRI_NAMESPACE, *args]


def import_archive(layout: RealNodeLayout, archive: bytes) -> None:
    out = subprocess.run(
        ctr(layout, "images", "import", "-"), input=archive, capture_output=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"ctr images import: {out.stderr.decode(errors='replace')[-2000:]}")


def import_docker_image(layout: RealNodeLayout, image: str, docker: str = "docker") -> float:
    """`docker save IMAGE | ctr images import -`: an image of the local Docker engine onto the
    node, under the same name. Returns the seconds it took."""
    t0 = time.monotonic()
    save = subprocess.Popen([docker, "save", image], stdout=subprocess.PIPE)
    imp = subprocess.run(
        ctr(layout, "images", "import", "-"), stdin=save.stdout, capture_output=True, check=False
    )
    if save.stdout is not None:
        save.stdout.close()
    if save.wait() != 0:
        raise RuntimeError(f"docker save {image} failed (is it built? `docker images {image}`)")
    if imp.returncode != 0:
        raise RuntimeError(f"ctr images import {image}: {imp.stderr.decode()[-2000:]}")
    return time.monotonic() - t0


def image_refs(layout: RealNodeLayout) -> list[str]:
    out = subprocess.run(
        ctr(layout, "images", "ls", "-q"), capture_output=True, text=True, check=False
    )
    return out.stdout.split() if out.returncode == 0 else []


def stop_shims(layout: RealNodeLayout) -> list[int]:
    """containerd's runc shims outlive containerd; they name its socket on their command line."""
    pids = procs.processes_mentioning(str(layout.socket))
    for pid in pids:
        procs.stop(pid, grace=2.0)
    return pids
