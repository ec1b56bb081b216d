"""A seeded fault-injection campaign in every CI run (the full one: docs/reliability.md).

It starts its own local cluster: the campaign runs its own operators (with faults, killed
and restarted), which must not share jobs with the suite's operator. Three scenarios (a gang
restart, suspend and resume, a TTL) and at least 8 faults fired: 6 minutes on the 2-core
development machine under a load of 12, 13 under 17 (it is mostly waiting on pods). That
the campaign can fail at all is proven by test_campaign_plants.py.
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
        [sys.executable, str(HERE / "faultrun.py"), "--faults", "8", "--runs", "3",
         "--per-run", "4", "--seed", "7", "--scenarios", "gang-restart,suspend-resume,ttl",
         "--json", str(out)],
        env=dict(os.environ), capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    tail = f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert out.exists(), tail
    tally = json.loads(out.read_text())
    assert [v for t in tally.values() for v in t["violations"]] == [], tail
    assert proc.returncode == 0, tail
    # Counted from the fault seam's own log: faults that fired, not the schedule.
    assert sum(sum(t["fired"].values()) for t in tally.values()) >= 8, tail
    assert all(t["runs"] >= 1 for t in tally.values()), tally
