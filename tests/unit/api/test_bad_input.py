"""The model refuses what admission refuses: every spec-level case of bad_input.py."""

from typing import Any

import pytest
from bad_input import CASES, GOOD, Case, apply, job
from pydantic import ValidationError
from torchrun_operator.api.models import JobSpec

SPEC_LEVEL = [c for c in CASES if c.spec_level]


def test_there_are_cases_of_every_kind() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)
    assert any(c.update for c in CASES) and len(SPEC_LEVEL) >= 30


def test_the_good_job_is_good() -> None:
    JobSpec.model_validate(GOOD["spec"])


@pytest.mark.parametrize("case", SPEC_LEVEL, ids=[c.id for c in SPEC_LEVEL])
def test_model_refuses(case: Case) -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(job(case)["spec"])
    expected = case.model_expected or case.expected
    assert expected in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.update], ids=[c.id for c in CASES if c.update]
)
def test_transition_cases_start_and_end_as_valid_specs_but_one(case: Case) -> None:
    """A transition case is about the change: its job is valid before it, and (but for the
    bounds case) after it too, so only a rule comparing with the old spec can refuse it."""
    before = job(case)
    JobSpec.model_validate(before["spec"])
    after: dict[str, Any] = apply(before, case.update or {})
    if "minNodes <= nodes" in case.expected:
        with pytest.raises(ValidationError):
            JobSpec.model_validate(after["spec"])
    else:
        JobSpec.model_validate(after["spec"])
