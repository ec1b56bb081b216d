"""What a pod says, parsed by reconcile/podinput.py: the hostile shapes of issue 24 §2 (a
64 KiB body of empty objects, a sentinel step, a total of 10**400, NaN, deep nesting, an
answer that does not say whose it is) are refused or reduced to a small validated value, and
random documents (hypothesis) never raise and never yield a value out of its range."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchrun_operator.launcher import contract, report
from torchrun_operator.reconcile import podinput
from torchrun_operator.reconcile.podinput import LiveAnswer, Rejected

BIND = {"v": 1, "rdzvId": "uid-0", "index": 0}


def body(**fields: Any) -> bytes:
    return json.dumps({**BIND, **fields}).encode()


def test_a_launchers_answer_is_kept_as_a_small_validated_value() -> None:
    answer = podinput.parse_answer(
        body(
            state="Training",
            groupRank=1,
            ranks=[3, 2],
            round=0,
            restarts=0,
            time=1.7e9,
            progress={"step": 7, "total": 10, "stepsPerSecond": 2.5, "lastStepAt": 1.7e9},
            stall={"at": 1.7e9, "stacks": [{"rank": 2, "inCollective": True, "at": "f:1 in g"}]},
        )
    )
    assert answer == LiveAnswer(
        rdzv_id="uid-0",
        index=0,
        state="Training",
        group_rank=1,
        ranks=(2, 3),
        round=0,
        restarts=0,
        step=7,
        total=10,
        steps_per_second=2.5,
        last_step_at=1.7e9,
        stall_at=1.7e9,
        stacks=(podinput.Stack(2, True, "f:1 in g"),),
    )


def test_64_kib_of_empty_objects_keeps_nothing_of_them() -> None:
    # 64 KiB of {} parse to about 1.6 MB of Python objects; what is kept is the answer alone.
    filler = ",".join(["{}"] * 20000)
    raw = b'{"v":1,"rdzvId":"uid-0","index":0,"x":[' + filler.encode() + b"]}"
    assert len(raw) <= podinput.MAX_ANSWER_BYTES
    answer = podinput.parse_answer(raw)
    assert answer == LiveAnswer("uid-0", 0)
    assert isinstance(answer, LiveAnswer) and answer.cost() < 1024


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (body(progress={"step": 18446744073709551615}), "progress.step"),
        (body(progress={"total": 10**400}), "integer of 401 digits"),
        (body(groupRank=2**63), "groupRank"),
        (body(round=-1), "round"),
        (b'{"v":1,"rdzvId":"uid-0","index":0,"progress":{"stepsPerSecond":NaN}}', "NaN"),
        (b'{"v":1,"rdzvId":"uid-0","index":0,"stall":{"at":Infinity}}', "Infinity"),
        (b'{"v":1,"rdzvId":"uid-0","index":0,"stall":{"at":1e400}}', "overflows"),
        (b"[" * 30000 + b"]" * 30000, "nested deeper"),
        (body(x=[[[[[[[1]]]]]]]), "nested deeper"),
        (b"{" + b" " * podinput.MAX_ANSWER_BYTES + b"}", "larger than"),
        (json.dumps({"v": 1, "index": 0}).encode(), "rdzvId or index is missing"),
        (json.dumps({"v": 1, "rdzvId": "uid-0"}).encode(), "rdzvId or index is missing"),
        (body(ranks=list(range(podinput.MAX_RANKS + 1))), "more than"),
        (body(ranks=[0, "1"]), "ranks"),
        (body(stall={"stacks": [{"inCollective": False}]}), "rank is missing"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
    ],
)
def test_hostile_answers_are_refused_with_a_reason(raw: bytes, why: str) -> None:
    answer = podinput.parse_answer(raw)
    assert isinstance(answer, Rejected), answer
    assert why in answer.reason


def test_strings_are_truncated_and_stacks_cut() -> None:
    stacks = [{"rank": 0, "at": "x" * 10_000}] * (podinput.MAX_STACKS + 5)
    # (decoded: past the byte cap, such a body is refused before it is decoded)
    answer = podinput.live_answer(
        {**BIND, "state": "S" * 1000, "ranks": [0], "stall": {"stacks": stacks}}
    )
    assert isinstance(answer, LiveAnswer)
    assert answer.state is not None and len(answer.state) == podinput.MAX_NAME
    assert len(answer.stacks) == podinput.MAX_STACKS
    assert all(len(s.location or "") == podinput.MAX_LOCATION for s in answer.stacks)


# ---- the report --------------------------------------------------------------------------


def report_json(**fields: Any) -> str:
    base: dict[str, Any] = {
        "v": 1,
        "state": "Failed",
        "groupRank": 0,
        "ranks": [0],
        "restarts": 0,
        "failures": [],
    }
    return json.dumps({**base, **fields})


def test_the_launchers_own_report_reads_back_whole() -> None:
    failed = contract.FailureRecord(
        rank=1,
        localRank=1,
        exitCode=1,
        kind="exception",
        error="boom",
        at=5.5,
        location="/workspace/train.py:9 in <module>",
    )
    summary = report.build_summary(
        contract.FAILED, group_rank=0, ranks=[0, 1], failures=[failed], step=3
    )
    assert podinput.parse_report(report.encode_summary(summary).decode()) == summary


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"step": 18446744073709551615}, "step"),
        ({"state": "Running for ever" * 40}, "not a report state"),
        ({"failures": [{"rank": 0, "kind": "exception", "at": math.nan}]}, "NaN"),
        ({"failures": [{"rank": 0, "exitCode": 2**40}]}, "exitCode"),
        ({"failures": ["boom"]}, "non-object"),
        ({"ranks": [-1]}, "ranks"),
        ({"failures": [{"rank": 0, "location": ["/w/train.py", 9]}]}, "location is not a string"),
        # A line break or a terminal escape would forge lines where the location is shown.
        ({"failures": [{"rank": 0, "location": "/w/a.py:1 in f\nrank 0 ok"}]}, "does not print"),
        ({"failures": [{"rank": 0, "location": "/w/\x1b[2Ka.py:1 in f"}]}, "does not print"),
        ({"failures": [{"rank": 0, "location": "/w/\u202ea.py:1 in f"}]}, "does not print"),
    ],
)
def test_hostile_reports_are_refused(fields: dict[str, Any], why: str) -> None:
    found = podinput.parse_report(report_json(**fields))
    assert isinstance(found, Rejected) and why in found.reason, found


def test_a_message_that_is_no_report_is_none() -> None:
    assert podinput.parse_report("Error: exec format error") is None
    assert podinput.parse_report('{"some": "json"}') is None
    assert podinput.parse_report("") is None


def test_a_failures_stderr_tail_is_kept_truncated_and_dropped_unless_a_string() -> None:
    tail = "line\n" * 1000
    found = podinput.parse_report(
        report_json(
            failures=[{"rank": 0, "kind": "exit", "stderr": tail}, {"rank": 1, "stderr": 7}]
        )
    )
    assert not isinstance(found, Rejected) and found is not None
    first, second = found["failures"]
    assert first.get("stderr") == tail[-podinput.MAX_STDERR :]
    assert "stderr" not in second


def test_a_failures_location_is_kept_truncated() -> None:
    place = "/workspace/train.py:9 in <module>"
    found = podinput.parse_report(
        report_json(
            failures=[
                {"rank": 0, "kind": "exception", "location": place},
                {"rank": 1, "kind": "exception", "location": "/w/" + "d" * 1000},
                {"rank": 2, "kind": "exception", "location": ""},
            ]
        )
    )
    assert not isinstance(found, Rejected) and found is not None
    first, long, empty = found["failures"]
    assert first.get("location") == place
    assert len(long.get("location", "")) == podinput.MAX_LOCATION == contract.LOCATION_LIMIT
    assert "location" not in empty


# ---- fuzz --------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
_json = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children)
    ),
    max_leaves=30,
)
_keys = st.sampled_from(
    ["v", "rdzvId", "index", "state", "groupRank", "ranks", "round", "restarts", "progress"]
    + ["stall", "step", "total", "stepsPerSecond", "stepSeconds", "lastStepAt", "stacks", "rank"]
    + ["at", "inCollective", "failures", "kind", "exitCode", "error", "stderr", "message"]
)
# Documents shaped like ours, with hostile values where the fields are.
_shaped = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=8),
    max_leaves=40,
)


def _in_range(answer: LiveAnswer) -> None:
    for n in (answer.group_rank, answer.round, answer.restarts, answer.step, answer.total):
        assert n is None or 0 <= n <= podinput.MAX_COUNT
    for f in (answer.steps_per_second, answer.step_seconds, answer.last_step_at, answer.stall_at):
        assert f is None or (math.isfinite(f) and 0 <= f <= podinput.MAX_TIME)
    assert all(0 <= r <= podinput.MAX_RANK for r in answer.ranks)
    assert len(answer.ranks) <= podinput.MAX_RANKS and len(answer.stacks) <= podinput.MAX_STACKS
    assert len(answer.rdzv_id) <= podinput.MAX_ID and len(answer.state or "") <= podinput.MAX_NAME


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_json, _shaped, st.fixed_dictionaries({}, optional={})).map(lambda d: d))
def test_fuzz_any_document_is_refused_or_in_range(doc: Any) -> None:
    for data in (doc, {**BIND, **doc} if isinstance(doc, dict) else doc):
        raw = json.dumps(data, allow_nan=True).encode()
        answer = podinput.parse_answer(raw)
        assert isinstance(answer, LiveAnswer | Rejected)
        if isinstance(answer, LiveAnswer):
            _in_range(answer)
        found = podinput.parse_report(raw.decode())
        assert found is None or isinstance(found, Rejected | dict)
        if isinstance(found, dict):
            # A kept report writes into the status as is: it must be JSON without NaN.
            json.dumps(found, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512) | st.text(max_size=512).map(str.encode))
def test_fuzz_any_bytes_are_refused_or_in_range(raw: bytes) -> None:
    answer = podinput.parse_answer(raw)
    assert isinstance(answer, LiveAnswer | Rejected)


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=1, max_value=200_000), st.sampled_from(["[", '{"a":', '[{"b":']))
def test_fuzz_nesting_of_any_depth_never_raises(depth: int, opener: str) -> None:
    raw = (opener * depth)[: podinput.MAX_ANSWER_BYTES]
    assert isinstance(podinput.parse_answer(raw.encode()), Rejected)


# ---- checkpoint reports (docs/progress.md, "Checkpoints") ----------------------------------


def _answer_with(checkpoint: object) -> Any:
    return podinput.live_answer(
        {
            "v": contract.LIVE_VERSION,
            "rdzvId": "u-0",
            "index": 0,
            "progress": {"step": 5, "checkpoint": checkpoint},
        }
    )


def test_a_checkpoint_report_is_kept_bounded() -> None:
    got = _answer_with({"step": 4, "path": "/c/4", "at": 1700000000.5})
    assert isinstance(got, LiveAnswer)
    assert got.checkpoint == podinput.CheckpointReport(4, "/c/4", 1700000000.5)
    assert isinstance(_answer_with(None), LiveAnswer) and _answer_with(None).checkpoint is None


@pytest.mark.parametrize(
    ("checkpoint", "why"),
    [
        ({"step": 4, "path": "x" * 1025}, "longer than 1024"),
        ({"step": 4, "path": "/a\n/b"}, "line break"),
        ({"step": -1, "path": "/a"}, "out of range"),
        ({"step": True, "path": "/a"}, "not an integer"),
        ({"path": "/a"}, "missing"),
        ({"step": 4}, "missing"),
        ("/a", "not an object"),
    ],
)
def test_a_bad_checkpoint_report_refuses_the_answer(checkpoint: object, why: str) -> None:
    got = _answer_with(checkpoint)
    assert isinstance(got, Rejected) and why in got.reason, got


def test_the_avoided_nodes_annotation_is_read_as_written() -> None:
    assert podinput.avoided_nodes("gpu-node-2,rack1.node-7") == {"gpu-node-2", "rack1.node-7"}
    assert podinput.avoided_nodes(None) == frozenset()


@pytest.mark.parametrize(
    "value",
    [
        "",
        ",",
        "n1,,n2",
        "Node-Upper",
        "n1, n2",
        "n" * 254,
        ",".join(f"n{i}" for i in range(podinput.MAX_AVOIDED + 1)),
        "n1," * 10_000,
        ["n1"],
        7,
    ],
)
def test_an_avoided_nodes_annotation_not_as_written_says_nothing(value: object) -> None:
    """Anyone who may edit the pod may edit it: what the operator never writes keeps the pod
    off no node as far as the operator knows (it is not deleted for it)."""
    assert podinput.avoided_nodes(value) == frozenset()
