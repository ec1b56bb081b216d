"""What a conversion yields: the job, a warning for whatever did not carry over or changes
meaning, and an error for whatever the job printed lacks; or a ConvertError when the input is
not a PyTorchJob this command can convert."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from torchrun_operator.api import models


class ConvertError(ValueError):
    """The input is not a PyTorchJob this command can convert (one line)."""


@dataclass
class Conversion:
    """A PyTorchJob converted, and what the user must know about it."""

    job: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """What the job printed lacks: it needs editing before it can run (exit status 1)."""

    def warn(self, where: str, text: str) -> None:
        self.warnings.append(f"{where}: {text}")

    def error(self, where: str, text: str) -> None:
        self.errors.append(f"{where}: {text}")


def bounded(value: Any, low: int, high: int, where: str, out: Conversion) -> int:
    """`value` within low..high, with a warning where it had to be clamped."""
    n = int(value)
    if n < low or n > high:
        clamped = min(max(n, low), high)
        out.warn(
            where, f"{n} is outside {low}..{high}, the bounds of the operator's API: {clamped}"
        )
        return clamped
    return n


def validate(job: dict[str, Any]) -> str | None:
    """Why the converted job is not a valid DistributedTrainingJob, None if it is."""
    try:
        models.JobSpec.model_validate(job["spec"])
    except ValidationError as e:
        return "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}" for err in e.errors()
        )
    return None
