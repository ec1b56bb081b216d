"""The launcher's report (its termination message) for tests that need one without running
the launcher: built by the launcher's own `build_summary`, with failures of the contract's
`FailureRecord` shape, so a change to the report changes these too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchrun_operator.launcher import contract
from torchrun_operator.launcher import report as launcher_report


def failure(
    rank: int,
    kind: contract.FailureKind,
    at: float,
    error: str = "",
    exit_code: int = 1,
    local_rank: int = 0,
) -> contract.FailureRecord:
    """One failed worker; `at` in unix seconds."""
    return contract.FailureRecord(
        rank=rank, localRank=local_rank, exitCode=exit_code, kind=kind, error=error, at=at
    )


def report(
    state: str = contract.SUCCEEDED,
    ranks: Sequence[int] = (),
    failures: Sequence[contract.FailureRecord] = (),
    restarts: int = 0,
    message: str | None = None,
    group_rank: int | None = 0,
    step: int | None = None,
    checkpoint: Mapping[str, Any] | None = None,
    reported_at: float | None = None,
) -> str:
    """The termination message a launcher writes, as the pod's status carries it;
    `reported_at`: when it was written (the launcher's write_summary adds it to a report with
    failures)."""
    summary = launcher_report.build_summary(
        state,
        group_rank=group_rank,
        ranks=ranks,
        restarts=restarts,
        failures=failures,
        message=message,
        step=step,
        checkpoint=checkpoint,
    )
    if reported_at is not None:
        summary["reportedAt"] = reported_at
    return launcher_report.encode_summary(summary).decode("utf-8")
