"""The one time parser and formatter: what the status writes for what a client hands over."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from torchrun_operator.api.timefmt import fmt, parse, restamp, seconds

T = datetime(2026, 11, 26, 1, 2, 3, tzinfo=UTC)


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-26T01:02:03Z",
        "2026-11-26T02:02:03+01:00",
        "2026-11-26T01:02:03.900Z",
        T,
        T.replace(tzinfo=None),
        T.astimezone(timezone(timedelta(hours=-5))),
        T.timestamp(),
        int(T.timestamp()),
    ],
)
def test_every_accepted_time_is_written_in_utc_to_the_second(value: object) -> None:
    assert fmt(parse(value)) == "2026-11-26T01:02:03Z"  # type: ignore[arg-type]
    assert restamp(value) == restamp(value) == "2026-11-26T01:02:03Z"
    assert seconds(value) == pytest.approx(T.timestamp(), abs=1)


@pytest.mark.parametrize("value", [None, "", "yesterday", object(), [1]])
def test_anything_else_is_no_time(value: object) -> None:
    assert parse(value) is None and restamp(value) is None and seconds(value) is None
