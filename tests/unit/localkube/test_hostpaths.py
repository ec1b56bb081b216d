"""The host mountpoints a node creates (localkube/node/hostpaths.py) are removed at its
shutdown only when empty and mounted nowhere: a pod of another cluster on this host that
bind-mounts onto the same path keeps its volume (removing a mountpoint on the host detaches
the mounts on it in every other mount namespace)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from localkube.node.hostpaths import CreatedPaths
from localkube.procs import mounted_in_any_namespace


def test_empty_created_paths_are_removed_and_foreign_ones_kept(tmp_path: Path) -> None:
    created = CreatedPaths(tmp_path / "state" / "created-paths.json")
    target = tmp_path / "host" / "workspace"
    created.ensure(str(target), is_file=False)
    created.ensure(str(tmp_path / "host" / "file"), is_file=True)
    assert target.is_dir()
    (tmp_path / "mine").mkdir()  # not created by the node: never touched
    created.remove_all()
    assert not (tmp_path / "host").exists()
    assert (tmp_path / "mine").is_dir()
    # The record survives a restart of the node.
    assert CreatedPaths(tmp_path / "state" / "created-paths.json").paths == []


def test_a_path_another_namespace_mounts_on_is_kept_until_it_is_free(tmp_path: Path) -> None:
    created = CreatedPaths(tmp_path / "created-paths.json")
    target = tmp_path / "workspace"
    created.ensure(str(target), is_file=False)
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "train.py").write_text("print('hi')\n")
    # Another cluster's pod: its own mount namespace, the volume bound onto the same path.
    pod = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount --bind {volume} {target} && echo ready && exec sleep 60",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert pod.stdout is not None and pod.stdout.readline().strip() == "ready"
        assert mounted_in_any_namespace(target)
        created.remove_all()
        assert target.is_dir(), "removed under a pod that mounts on it"
        seen = Path(f"/proc/{pod.pid}/root{target}/train.py")
        assert seen.read_text() == "print('hi')\n", "the pod lost its volume"
        assert created.paths == [str(target)]
    finally:
        pod.kill()
        pod.wait()
    assert not mounted_in_any_namespace(target)
    created.remove_all()
    assert not target.exists()
    assert created.paths == []
