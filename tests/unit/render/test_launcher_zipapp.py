"""The launcher ships as a zipapp of its package in the ConfigMap's binaryData: built the same
from the same sources (its digest names its code), holding every module of the package, small
enough for a ConfigMap, and runnable by any Python 3.10+ with nothing but the standard library
(the pod's bootstrap checks its digest, then runs it with runpy.run_path)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import jobs
from torchrun_operator.launcher import contract
from torchrun_operator.render import children
from torchrun_operator.render.configmap import (
    ZIP_PACKAGE,
    build_zipapp,
    launcher_digest,
    launcher_files,
    packaged_launcher,
    packaged_launcher_digest,
)
from torchrun_operator.render.pod import LAUNCHER_BOOTSTRAP

PACKAGE = Path(__file__).resolve().parents[3] / "operator/torchrun_operator/launcher"


def test_two_builds_are_byte_identical() -> None:
    assert build_zipapp(launcher_files()) == build_zipapp(launcher_files()) == packaged_launcher()
    # the order the files are given in changes nothing
    files = launcher_files()
    assert build_zipapp(dict(reversed(list(files.items())))) == packaged_launcher()


def test_the_digest_is_the_sha256_of_the_zip_bytes() -> None:
    digest = hashlib.sha256(packaged_launcher()).hexdigest()
    assert launcher_digest(packaged_launcher()) == packaged_launcher_digest() == digest


def test_it_holds_every_launcher_module_and_a_root_main() -> None:
    with zipfile.ZipFile(io.BytesIO(packaged_launcher())) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        modules = {p.name: p.read_bytes() for p in PACKAGE.glob("*.py")}
        assert {"__init__.py", "contract.py", "main.py", "shim.py"} <= set(modules)
        assert names == sorted(["__main__.py", *(f"{ZIP_PACKAGE}/{m}" for m in modules)])
        for module, source in modules.items():
            assert zf.read(f"{ZIP_PACKAGE}/{module}") == source
        assert all(i.compress_type == zipfile.ZIP_STORED for i in infos)
        assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}


def test_a_changed_module_changes_the_digest() -> None:
    files = launcher_files()
    files[f"{ZIP_PACKAGE}/main.py"] += b"\n# changed\n"
    assert launcher_digest(build_zipapp(files)) != packaged_launcher_digest()


def test_the_configmap_is_well_under_a_mebibyte() -> None:
    job = jobs.job(metadata={"namespace": "ml", "uid": "u-1", "generation": 1})
    _, cm = children(job, packaged_launcher(), network_policy_default=False)
    assert base64.b64decode(cm["binaryData"][contract.LAUNCHER_FILE]) == packaged_launcher()
    size = len(json.dumps(cm).encode())
    assert size < 256 * 1024, size  # Kubernetes refuses a ConfigMap over 1 MiB


def test_it_runs_with_only_the_standard_library(tmp_path: Path) -> None:
    """-I: no site-packages (no torch), no PYTHONPATH, no checkout on sys.path."""
    pyz = tmp_path / contract.LAUNCHER_FILE
    pyz.write_bytes(packaged_launcher())
    res = subprocess.run(
        [sys.executable, "-I", str(pyz), "--help"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: python launcher.pyz")


def test_the_pods_bootstrap_runs_it_only_with_its_digest(tmp_path: Path) -> None:
    pyz = tmp_path / contract.LAUNCHER_FILE
    pyz.write_bytes(packaged_launcher())
    run = [sys.executable, "-I", "-c", LAUNCHER_BOOTSTRAP, str(pyz)]
    ok = subprocess.run(
        [*run, packaged_launcher_digest(), "--help"], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and ok.stdout.startswith("usage: python launcher.pyz"), ok.stderr
    bad = subprocess.run([*run, "0" * 64, "--help"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "is not the launcher the operator rendered" in bad.stderr
    assert "usage:" not in bad.stdout
