"""Jobs reconciled without a validated spec: one whose spec the model refuses (it fails, like
any other failure) and one whose spec.runtimeRef names a runtime that does not exist yet (it
waits, Pending). Both act on a context built by `bare_ctx` from the unvalidated spec."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..api.models import JobSpec, RunPolicy
from ..api.status_names import FINISHED, ConditionType, Phase, Reason
from .context import Ctx
from .finish import after_finish, finish
from .observe import PodView, truncate
from .plan import Plan
from .runtimeref import RUNTIME_RETRY_SECONDS


def bare_ctx(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    status: dict[str, Any],
    now: datetime,
    view_of: Callable[[dict[str, Any], str | None], PodView],
) -> Ctx:
    """A context whose spec carries only the job's runPolicy, validated (a runPolicy that is
    itself invalid is the defaults'): what the job's end (finish.py) reads, and nothing that
    starts pods."""
    raw = job.get("spec") or {}
    uid = job["metadata"].get("uid")
    views = [view_of(p, _trainer_name(raw)) for p in pods]
    return Ctx(
        job=job,
        spec=JobSpec.model_construct(run_policy=_run_policy(raw.get("runPolicy"))),
        now=now.timestamp(),
        status=status,
        pods=[v for v in views if v.owner_uid == uid],  # ownership by controller uid alone
        taken={v.name for v in views},
    )


def invalid(ctx: Ctx, problem: str) -> Plan:
    """A spec the model refuses fails the job like any other failure (finish.py): its pods
    go per cleanPodPolicy and its TTL applies, now and on every later reconcile."""
    if ctx.phase in FINISHED:
        after_finish(ctx)
    else:
        finish(ctx, Phase.FAILED, Reason.INVALID_SPEC, truncate(problem) or "")
    return ctx.plan()


def await_runtime(ctx: Ctx, runtime: str) -> Plan:
    """The job's runtime does not exist (yet): it stays Pending, creates nothing, and says
    which runtime it waits for; the shell reads the runtime again after
    RUNTIME_RETRY_SECONDS."""
    message = f"{runtime} (spec.runtimeRef) not found; the job starts once it exists"
    if ctx.set_cond(ConditionType.RUNTIME_RESOLVED, False, Reason.RUNTIME_NOT_FOUND, message):
        ctx.event("Warning", Reason.RUNTIME_NOT_FOUND, message)
    ctx.requeue.append(RUNTIME_RETRY_SECONDS)
    return ctx.plan()


def _run_policy(raw: Any) -> RunPolicy:
    try:
        return RunPolicy.model_validate(raw or {})
    except ValidationError:
        return RunPolicy()


def _trainer_name(raw: Mapping[str, Any]) -> str | None:
    """The first container's name in an unvalidated spec, if it has one."""
    try:
        name = raw["template"]["spec"]["containers"][0]["name"]
    except (KeyError, IndexError, TypeError):
        return None
    return name if isinstance(name, str) else None
