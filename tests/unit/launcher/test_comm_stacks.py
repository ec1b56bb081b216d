"""After a communication failure the report names the ranks the launcher found outside any
collective (`stacks`), bounded, and the operator reads them back checked."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torchrun_operator.launcher import agent, contract, report, stacks
from torchrun_operator.reconcile import podinput


def test_only_ranks_outside_a_collective_are_reported_and_at_most_a_few() -> None:
    dumped: list[dict[str, Any]] = [
        {"rank": 0, "localRank": 0, "inCollective": True, "at": "/t.py:9 in step"},
        {"rank": 1, "localRank": 1, "inCollective": False, "at": "/t.py:40 in main"},
        {"rank": None, "inCollective": False, "at": "x"},  # a worker that never said its rank
        *({"rank": r, "inCollective": False, "at": "/t.py:1 in f" * 50} for r in range(2, 9)),
    ]
    out = stacks.report_stacks(dumped)
    assert out[0] == {"rank": 1, "inCollective": False, "at": "/t.py:40 in main"}
    assert len(out) == contract.MAX_REPORT_STACKS
    assert all(len(s.get("at", "")) <= 256 for s in out)


def test_the_report_carries_them_and_reads_back_whole() -> None:
    stacks = [{"rank": 1, "inCollective": False, "at": "/t.py:40 in main"}]
    summary = report.build_summary(
        contract.FAILED, group_rank=1, ranks=[1], stacks=stacks, message="x"
    )
    assert podinput.parse_report(report.encode_summary(summary).decode()) == summary


def test_a_report_too_big_drops_its_stacks_before_its_ranks() -> None:
    stacks = [{"rank": 1, "inCollective": False, "at": "a" * 256}] * 4
    summary = report.build_summary(
        contract.FAILED, ranks=list(range(900)), stacks=stacks, message="m"
    )
    fitted = report.fit_summary(summary)
    assert "stacks" not in fitted and len(fitted["ranks"]) == 900
    assert len(report.encode_summary(summary)) <= contract.TERMINATION_LIMIT


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
    many = [{"rank": r, "inCollective": False, "at": "f" * 300} for r in range(20)]
    message = json.dumps({"v": 1, "state": "Failed", "ranks": [], "failures": [], "stacks": many})
    got = podinput.parse_report(message)
    assert isinstance(got, dict)
    assert len(got["stacks"]) == contract.MAX_REPORT_STACKS
    assert all(len(s["at"]) <= podinput.MAX_LOCATION for s in got["stacks"])


# ---- the closed rendezvous: a peer's failure, or the end of a successful run -------------


class FakeStore:
    def __init__(self, keys: set[str]) -> None:
        self.keys = keys

    def check(self, keys: list[str]) -> bool:
        return all(k in self.keys for k in keys)


def fake_handler(closed: bool, keys: set[str]) -> Any:
    state = SimpleNamespace(closed=closed, round=3, wait_list=set())
    return SimpleNamespace(
        _heartbeat_lock=threading.Lock(),
        _state_holder=SimpleNamespace(sync=lambda: None, state=state),
        _settings=SimpleNamespace(run_id="uid-0"),
        _store=FakeStore(keys),
    )


@pytest.fixture
def waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str]]:
    """torch's num_nodes_waiting as the launcher wraps it (torch's classes restored after),
    with the stack dump recorded instead of signalling workers."""
    from torch.distributed.elastic.agent.server import api as agent_api
    from torch.distributed.elastic.multiprocessing import api as mp_api
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    for cls, name in (
        (mp_api.PContext, "close"),
        (agent_api.SimpleElasticAgent, "_invoke_run"),
        (rdzv.DynamicRendezvousHandler, "num_nodes_waiting"),
    ):
        monkeypatch.setattr(cls, name, getattr(cls, name))
    monkeypatch.setattr(stacks, "_comm_dumped", [])
    monkeypatch.setattr(stacks, "comm_stacks", [])
    dumps: list[str] = []

    def dump(sdir: str, wait: float = 0) -> list[dict[str, Any]]:
        dumps.append(sdir)
        return [{"rank": 0, "inCollective": False, "at": "/t.py:60 in main"}]

    monkeypatch.setattr(stacks, "dump_worker_stacks", dump)
    agent._patch_comm_failure_stacks(str(tmp_path), None)
    return rdzv.DynamicRendezvousHandler.num_nodes_waiting, dumps


def test_a_rendezvous_a_failed_peer_closed_ends_this_node_with_its_stacks(
    waiting: tuple[Any, list[str]],
) -> None:
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError

    num_nodes_waiting, dumps = waiting
    handler = fake_handler(closed=True, keys={"torchrun-operator/uid-0/3/workers-failed"})
    with pytest.raises(RendezvousClosedError, match="another node's agent ended"):
        num_nodes_waiting(handler)
    assert len(dumps) == 1
    assert stacks.comm_stacks == [{"rank": 0, "inCollective": False, "at": "/t.py:60 in main"}]


def test_a_rendezvous_closed_after_success_or_another_round_changes_nothing(
    waiting: tuple[Any, list[str]],
) -> None:
    num_nodes_waiting, dumps = waiting
    # closed after every agent passed the exit barrier: no failure mark
    assert num_nodes_waiting(fake_handler(closed=True, keys=set())) == 0
    # a failure marked in an earlier round (an in-pod restart followed)
    assert (
        num_nodes_waiting(
            fake_handler(closed=True, keys={"torchrun-operator/uid-0/2/workers-failed"})
        )
        == 0
    )
    # marked but still open (the failed agent restarts its workers in place)
    assert (
        num_nodes_waiting(
            fake_handler(closed=False, keys={"torchrun-operator/uid-0/3/workers-failed"})
        )
        == 0
    )
    assert dumps == []
