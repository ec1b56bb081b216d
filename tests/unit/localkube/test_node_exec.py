"""Exec probes (localkube.node.runtime.exec_in) run in the container's namespaces and root."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from localkube.node.runtime import exec_in


def test_an_exec_probe_reads_the_containers_files_when_its_root_is_not_its_namespaces(
    tmp_path: Path,
) -> None:
    """A container whose root directory is not its mount namespace's root, as every pod's is
    when the node itself runs in a chroot (hack/fresh-root.sh): the probe must read the
    container's /mnt, not the namespace root's. Without nsenter -r it read the host's, and no
    trainer became Ready in the fresh root."""
    root = tmp_path / "root"
    root.mkdir()
    script = (
        f"mount --rbind / {root} && mount -t tmpfs probe {root}/mnt && "
        f"echo ready > {root}/mnt/probe-file && exec chroot {root} sleep 60"
    )
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/root") == "/":
            assert proc.poll() is None, "the container did not start"
            assert time.monotonic() < deadline, "the container never entered its root"
            time.sleep(0.05)
        res = exec_in(proc.pid, ["cat", "/mnt/probe-file"], dict(os.environ), 10)
        assert (res.returncode, res.stdout) == (0, b"ready\n"), res.stderr
    finally:
        proc.kill()
        proc.wait()
