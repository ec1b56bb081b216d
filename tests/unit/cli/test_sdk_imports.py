"""`pip install torchrun-operator` (no extras) has no kopf and no prometheus-client: the SDK
and kubectl-dtj must import and run without them. Checked in a fresh interpreter where both
are blocked (a None in sys.modules makes their import fail as if they were not installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

OPERATOR = Path(__file__).resolve().parents[3] / "operator"

BLOCKED = """
import importlib, pkgutil, sys
sys.modules["kopf"] = None
sys.modules["prometheus_client"] = None
import torchrun_operator.client as sdk
import torchrun_operator.cli as cli
for pkg in (sdk, cli):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(m.name)
from torchrun_operator.cli.main import main
try:
    main(["--help"])
except SystemExit as e:
    assert e.code == 0, e.code
print("imported", len([m for m in sys.modules if m.startswith("torchrun_operator.")]))
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(OPERATOR), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sdk_and_cli_import_and_run_without_kopf_or_prometheus_client() -> None:
    proc = run(BLOCKED)
    assert proc.returncode == 0, proc.stderr
    assert "usage: kubectl dtj" in proc.stdout
    assert "imported" in proc.stdout


def test_the_block_works_the_operator_does_not_import_without_its_extra() -> None:
    proc = run(
        BLOCKED.replace("import torchrun_operator.client as sdk", "import torchrun_operator.main")
    )
    assert proc.returncode != 0
    assert "ModuleNotFoundError" in proc.stderr or "ImportError" in proc.stderr
