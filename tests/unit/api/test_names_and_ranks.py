import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrun_operator.api.names import pod_name
from torchrun_operator.api.ranks import format_ranks, parse_ranks


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([], ""),
        ([0], "0"),
        ([0, 1, 2, 3, 8, 9, 10, 11], "0-3,8-11"),
        ([5, 3, 4, 4], "3-5"),
        ([1, 3], "1,3"),
    ],
)
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=200))
def test_rank_strings_round_trip(ranks: list[int]) -> None:
    assert parse_ranks(format_ranks(ranks)) == sorted(set(ranks))


@pytest.mark.parametrize("bad", ["a", "3-1", "1-", "-1"])
def test_parse_ranks_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_ranks(bad)


def test_long_job_names_are_shortened_with_hash_and_stay_distinct() -> None:
    a = "x" * 58 + "a"
    b = "x" * 58 + "b"
    na, nb = pod_name(a, 9, 12345, 7), pod_name(b, 9, 12345, 7)
    assert na != nb
    assert len(na) <= 63 and re.fullmatch(r"[a-z0-9-]+", na)
    assert na.endswith("-9-a12345r7")
