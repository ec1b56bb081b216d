"""A failure without a recorded error quotes the worker's stderr tail, with a hint naming
spec.torchrun.localRankArg where argparse asked for --local-rank (docs/migrating.md)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torchrun_operator.reconcile import observe, rootcause
from torchrun_operator.reconcile.crashloop import signature
from torchrun_operator.reconcile.worker_stderr import (
    LOCAL_RANK_HINT,
    MESSAGE_LIMIT,
    failure_message,
    local_rank_hint,
)

BARE = "exited with code 2 without recording an error"
USAGE = "usage: train.py [-h] --local_rank LOCAL_RANK [--epochs EPOCHS]\n"


@pytest.mark.parametrize(
    "stderr",
    [
        USAGE + "train.py: error: the following arguments are required: --local_rank",
        USAGE + "train.py: error: the following arguments are required: --local-rank, --data",
        "train.py: error: the following arguments are required: --data, --local_rank",
        "usage: t.py [-h] [--local_rank L]\nt.py: error: unrecognized arguments: --local-rank=0",
        "t.py: error: unrecognized arguments: --local_rank=1 --foo",
    ],
)
def test_argparse_asking_for_local_rank_gets_the_hint(stderr: str) -> None:
    assert local_rank_hint(stderr) == LOCAL_RANK_HINT
    message = failure_message(BARE, stderr)
    assert message is not None
    first, *rest = message.splitlines()
    assert first == f"{BARE} ({LOCAL_RANK_HINT})"
    assert "spec.torchrun.localRankArg" in first
    assert message.endswith(stderr.splitlines()[-1])


@pytest.mark.parametrize(
    "stderr",
    [
        USAGE + "train.py: error: the following arguments are required: --data",
        "t.py: error: unrecognized arguments: --lr=0.1",
        "INFO local_rank=0 starting\nSegmentation fault",
        "train.py: error: argument --local_rank: invalid int value: 'x'",
    ],
)
def test_other_stderr_is_quoted_without_a_hint(stderr: str) -> None:
    assert local_rank_hint(stderr) is None
    message = failure_message(BARE, stderr)
    assert message == f"{BARE}\nstderr ends:\n{stderr}"


def test_without_a_tail_the_error_is_the_message() -> None:
    assert failure_message("RuntimeError: boom", None) == "RuntimeError: boom"
    assert failure_message(BARE, "  \n") == BARE
    assert failure_message(None, None) is None
    assert failure_message("", 42) is None  # not a string: ignored


def test_a_long_tail_keeps_its_last_whole_lines_within_the_limit() -> None:
    noise = "".join(f"log line {i} " + "x" * 50 + "\n" for i in range(60))
    stderr = noise + "train.py: error: the following arguments are required: --local-rank"
    message = failure_message(BARE, stderr)
    assert message is not None and len(message) <= MESSAGE_LIMIT
    assert message.endswith("the following arguments are required: --local-rank")
    quoted = message.split("\nstderr ends:\n", 1)[1]
    assert quoted.startswith("log line ")  # from a line start


@given(st.text(max_size=3000), st.one_of(st.none(), st.text(max_size=5000)))
def test_failure_message_is_bounded(error: str, stderr: str | None) -> None:
    message = failure_message(error[:200], stderr)
    assert message is None or len(message) <= MESSAGE_LIMIT


def _pod(failure: dict[str, object]) -> observe.PodView:
    report: Any = {"v": 1, "state": "Failed", "groupRank": 0, "ranks": [0], "failures": [failure]}
    return observe.PodView(
        name="job-0",
        node_index=0,
        attempt=0,
        owner_uid="uid",
        phase="Failed",
        terminating=False,
        deletion_time=None,
        ready=False,
        node="n1",
        reason="Error",
        message=None,
        exit_code=2,
        started_at=None,
        finished_at=None,
        report=report,
        disruption=None,
    )


def test_root_cause_message_quotes_stderr_and_signature_ignores_it() -> None:
    base = {"rank": 0, "localRank": 0, "exitCode": 2, "kind": "exit", "error": BARE, "at": 1.0}
    said = "12:00:01 starting\nt.py: error: the following arguments are required: --local_rank"
    a = {**base, "stderr": said}
    b = {**base, "stderr": said.replace("12:00:01", "12:05:09")}
    (ca,) = rootcause.pod_candidates(0, _pod(a), 5.0, 10.0)
    (cb,) = rootcause.pod_candidates(0, _pod(b), 5.0, 10.0)
    assert ca.message is not None
    assert ca.message.endswith("required: --local_rank")
    assert "spec.torchrun.localRankArg" in ca.message
    assert signature(ca) == signature(cb)  # a crash loop is still recognised
    (plain,) = rootcause.pod_candidates(0, _pod(base), 5.0, 10.0)
    assert plain.message == BARE
