"""The progress file is the user's script's output: untrusted input to the launcher.

Whatever it holds, reading it must neither raise (a RecursionError while decoding it once
ended a job that trained correctly as `launcher error`) nor yield a step outside the
documented range (integers 0..2**53): such a read is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchrun_operator.launcher import progress_file, status_server

HOSTILE = {
    "nested-array": "[" * 100_000 + "]" * 100_000,
    "nested-object": '{"step": ' + "[" * 5000 + "]" * 5000 + "}",
    "nested-in-field": '{"step": 3, "x": ' + "{" * 3000 + "}" * 3000 + "}",
    "uint64-step": '{"step": 18446744073709551615}',
    "huge-int-step": '{"step": ' + "1" + "0" * 400 + "}",
    "huge-int-plain": "1" + "0" * 400,
    "overflow-float": '{"step": 1e400}',
    "nan-step": '{"step": NaN}',
    "infinity-step": '{"step": Infinity}',
    "negative-step": '{"step": -5}',
    "negative-plain": "-5",
    "bool-step": '{"step": true}',
    "string-step-too-long": '{"step": "' + "1" * 40 + '"}',
    "fraction-step": '{"step": 1.5}',
    "too-many-digits": "9" * 5000,
    "unicode-digits": "\u0661\u0662",  # Arabic-Indic "12": int() would take it
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_progress_is_ignored(text: str) -> None:
    assert progress_file.parse_progress(text) is None


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_read_step_of_a_hostile_file_is_none(tmp_path: Path, text: str) -> None:
    p = tmp_path / "progress"
    p.write_text(text)
    assert progress_file.read_step(str(p)) is None


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ('{"step": 7, "total": 18446744073709551615}', {"step": 7}),
        ('{"step": 7, "total": -1}', {"step": 7}),
        ('{"step": 7, "stepTime": NaN}', {"step": 7}),
        ('{"step": 7, "stepTime": Infinity}', {"step": 7}),
        ('{"step": 7, "stepTime": -0.5}', {"step": 7}),
        ('{"step": 7, "stepTime": 1e400}', {"step": 7}),
        ('{"step": 7, "total": 1e400}', {"step": 7}),
        ("7 18446744073709551615", {"step": 7}),
        (f"{2**53} {2**53}", {"step": 2**53, "total": 2**53}),
        (f"{2**53 + 1}", None),
        ('{"step": 9007199254740992}', {"step": 2**53}),
        ('{"step": 7.0}', {"step": 7}),
        ('{"step": "12"}', {"step": 12}),
        ('{"step": 7, "stepTime": 1e300}', {"step": 7}),
        ('{"step": 7, "stepTime": 0.25}', {"step": 7, "stepTime": 0.25}),
    ],
)
def test_out_of_range_fields_are_dropped_in_range_kept(
    text: str, parsed: dict[str, float] | None
) -> None:
    assert progress_file.parse_progress(text) == parsed


def test_binary_junk_is_ignored(tmp_path: Path) -> None:
    p = tmp_path / "progress"
    p.write_bytes(bytes(range(256)) * 64)
    assert progress_file.read_step(str(p)) is None
    assert progress_file.parse_progress(progress_file.read_progress_text(str(p))) is None


def test_a_huge_file_is_read_from_its_end_only(tmp_path: Path) -> None:
    # A script that appends a line per step: the last line counts, and only the file's last
    # PROGRESS_READ_LIMIT bytes are read.
    p = tmp_path / "progress"
    with p.open("w") as fp:
        fp.write("x" * (8 << 20))  # 8 MiB of junk, then the lines
        for step in range(1000):
            fp.write(f"{step} 5000\n")
    text = progress_file.read_progress_text(str(p))
    assert text is not None and len(text.encode()) <= progress_file.PROGRESS_READ_LIMIT
    assert progress_file.read_step(str(p)) == 999


def test_a_huge_single_line_is_ignored(tmp_path: Path) -> None:
    p = tmp_path / "progress"
    p.write_text("1" * (1 << 20))
    assert progress_file.read_step(str(p)) is None


def test_a_fifo_does_not_block_the_reader(tmp_path: Path) -> None:
    # A FIFO with no writer would block open() forever: the progress thread must not hang.
    p = tmp_path / "progress"
    os.mkfifo(p)
    assert progress_file.read_progress_text(str(p)) is None
    assert progress_file.read_step(str(p)) is None


def test_meter_and_live_status_survive_hostile_files() -> None:
    live = status_server.LiveState()
    for text in ["3 10", *HOSTILE.values(), "4 10"]:
        live.observe_progress(100.0, text, 60.0)
    snap = live.snapshot(101.0)
    assert snap["progress"]["step"] == 4 and snap["progress"]["total"] == 10
    json.dumps(snap, allow_nan=False)  # the status answer stays valid JSON


def test_an_ignored_read_is_logged_once(capsys: pytest.CaptureFixture[str]) -> None:
    progress_file._progress_warned.clear()
    for text in HOSTILE.values():
        progress_file.parse_progress(text)
    err = capsys.readouterr().err
    assert err.count("ignoring progress file content") == 1, err


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(max_size=300),
        st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace")),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers()
            | st.floats(allow_nan=True, allow_infinity=True)
            | st.text(max_size=10),
            lambda kids: (
                st.lists(kids, max_size=4)
                | st.dictionaries(st.sampled_from(["step", "total", "stepTime", "x"]), kids)
            ),
            max_leaves=30,
        ).map(lambda v: json.dumps(v, allow_nan=True)),
        st.builds(
            lambda step, total, t: json.dumps({"step": step, "total": total, "stepTime": t}),
            st.integers() | st.floats() | st.none(),
            st.integers() | st.floats() | st.none(),
            st.integers() | st.floats() | st.none(),
        ),
        st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n),
    )
)
def test_fuzz_parse_progress(text: str) -> None:
    found = progress_file.parse_progress(text)
    if found is None:
        return
    assert set(found) <= {"step", "total", "stepTime"}
    for key in ("step", "total"):
        if key in found:
            v = found[key]
            assert type(v) is int and 0 <= v <= progress_file.MAX_STEP
    if "stepTime" in found:
        assert type(found["stepTime"]) is float
        assert 0 <= found["stepTime"] <= progress_file.MAX_STEP_TIME
    json.dumps(found, allow_nan=False)
