"""The launcher as the operator ships it: the zipapp of render/configmap.py, written to a file
as the pod mounts it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from torchrun_operator.launcher import contract, shim
from torchrun_operator.render.configmap import ZIP_PACKAGE, packaged_launcher

EntryArgs = Callable[[list[str]], list[str]]


@pytest.fixture(scope="session")
def launcher_pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("launcher") / contract.LAUNCHER_FILE
    path.write_bytes(packaged_launcher())
    return path


@pytest.fixture(scope="session")
def zip_entry_args(launcher_pyz: Path) -> EntryArgs:
    """worker_entry_args as the zipapp's shim computes it (in a pod), asked of the zipapp in a
    subprocess that has only the standard library and the archive on sys.path."""
    code = (
        "import json,sys;sys.path.insert(0,sys.argv[1]);"
        f"from {ZIP_PACKAGE} import shim;print(json.dumps(shim.worker_entry_args(sys.argv[2:])))"
    )

    def entry_args(cmd: list[str]) -> list[str]:
        res = subprocess.run(
            [sys.executable, "-I", "-c", code, str(launcher_pyz), *cmd],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        args: list[str] = json.loads(res.stdout)
        return args

    return entry_args


@pytest.fixture(params=["zipapp", "checkout"])
def entry_args(request: pytest.FixtureRequest) -> EntryArgs:
    """The worker's interpreter arguments from the shipped zipapp and from the checkout's
    package (how the launcher runs in a pod, and how tests import it)."""
    if request.param == "zipapp":
        zipped: EntryArgs = request.getfixturevalue("zip_entry_args")
        return zipped
    return shim.worker_entry_args
