"""bench/restart_modes.py's arithmetic: how long training stood still, from the workers'
log lines, and its table."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

import pytest  # noqa: E402

from bench.restart_modes import stood_still, table  # noqa: E402


def test_from_the_failure_to_the_last_start_of_the_next_round() -> None:
    logs = [
        "BENCH start 100.000\nBENCH fail 103.000\n",  # rank 1: its first round
        "noise\nBENCH start 100.100\n[launcher] restarting\nBENCH start 109.500\n",
        "BENCH start 100.050\nBENCH start 111.250\n",
    ]
    assert stood_still(logs) == pytest.approx(8.25)


def test_no_start_after_the_failure_is_an_error_not_a_figure() -> None:
    with pytest.raises(RuntimeError, match="no worker started after the failure"):
        stood_still(["BENCH start 1.000\nBENCH fail 2.000\n"])


def test_the_table_gives_the_ratio_per_size() -> None:
    rows = [
        {"pods": 8, "mode": "in-pod", "stood_still_s": 4.0},
        {"pods": 8, "mode": "recreate", "stood_still_s": 10.0},
    ]
    assert table(rows).splitlines()[-1] == "| 8 | 4.0 | 10.0 | 2.50x |"
