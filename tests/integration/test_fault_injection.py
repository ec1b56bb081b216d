"""A seeded fault-injection campaign in every CI run (the full one: docs/reliability.md).

It starts its own local cluster: the campaign runs its own operators (with faults, killed
and restarted), which must not share jobs with the suite's operator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.localkube


@pytest.mark.timeout(900)
def test_seeded_fault_campaign_keeps_every_invariant(tmp_path: Path) -> None:
    out = tmp_path / "tally.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "faultrun.py"), "--faults", "12", "--per-run", "3",
         "--seed", "7", "--json", str(out)],
        env=dict(os.environ), capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    tail = f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, tail
    tally = json.loads(out.read_text())
    assert sum(t["faults"] for t in tally.values()) >= 12, tail
    assert all(t["runs"] >= 1 for t in tally.values()), tally
    assert [v for t in tally.values() for v in t["violations"]] == [], tail
