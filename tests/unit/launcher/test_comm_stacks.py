"""After a communication failure the report names the ranks the launcher found outside any
collective (`stacks`), bounded, and the operator reads them back checked."""

from __future__ import annotations

import json
from typing import Any

import pytest
from torchrun_operator.launcher import launcher as L
from torchrun_operator.reconcile import podinput


def test_only_ranks_outside_a_collective_are_reported_and_at_most_a_few() -> None:
    dumped: list[dict[str, Any]] = [
        {"rank": 0, "localRank": 0, "inCollective": True, "at": "/t.py:9 in step"},
        {"rank": 1, "localRank": 1, "inCollective": False, "at": "/t.py:40 in main"},
        {"rank": None, "inCollective": False, "at": "x"},  # a worker that never said its rank
        *({"rank": r, "inCollective": False, "at": "/t.py:1 in f" * 50} for r in range(2, 9)),
    ]
    out = L.report_stacks(dumped)
    assert out[0] == {"rank": 1, "inCollective": False, "at": "/t.py:40 in main"}
    assert len(out) == L.MAX_REPORT_STACKS
    assert all(len(s.get("at", "")) <= 256 for s in out)


def test_the_report_carries_them_and_reads_back_whole() -> None:
    stacks = [{"rank": 1, "inCollective": False, "at": "/t.py:40 in main"}]
    summary = L.build_summary(L.FAILED, group_rank=1, ranks=[1], stacks=stacks, message="x")
    assert podinput.parse_report(L.encode_summary(summary).decode()) == summary


def test_a_report_too_big_drops_its_stacks_before_its_ranks() -> None:
    stacks = [{"rank": 1, "inCollective": False, "at": "a" * 256}] * 4
    summary = L.build_summary(L.FAILED, ranks=list(range(900)), stacks=stacks, message="m")
    fitted = L.fit_summary(summary)
    assert "stacks" not in fitted and len(fitted["ranks"]) == 900
    assert len(L.encode_summary(summary)) <= L.TERMINATION_LIMIT


@pytest.mark.parametrize(
    ("stacks", "why"),
    [
        (["boom"], "non-object"),
        ([{"inCollective": False}], "rank is missing"),
        ([{"rank": -1}], "rank"),
        ([{"rank": 1, "at": 5}], "not a string"),
        ({"rank": 1}, "not a list"),
    ],
)
def test_a_hostile_stacks_field_is_refused(stacks: object, why: str) -> None:
    message = json.dumps({"v": 1, "state": "Failed", "ranks": [], "failures": [], "stacks": stacks})
    got = podinput.parse_report(message)
    assert isinstance(got, podinput.Rejected) and why in got.reason


def test_stacks_beyond_the_cap_are_cut_and_long_locations_truncated() -> None:
    stacks = [{"rank": r, "inCollective": False, "at": "f" * 300} for r in range(20)]
    message = json.dumps({"v": 1, "state": "Failed", "ranks": [], "failures": [], "stacks": stacks})
    got = podinput.parse_report(message)
    assert isinstance(got, dict)
    assert len(got["stacks"]) == L.MAX_REPORT_STACKS
    assert all(len(s["at"]) <= podinput.MAX_LOCATION for s in got["stacks"])
